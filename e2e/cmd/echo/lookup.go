package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"
)

// lookup resolves NAME with Go's own resolver (the binary is static, so it
// reads the pod's /etc/resolv.conf and sends its queries over UDP port 53,
// as most applications do) and prints one line "addrs=A,B" of the sorted
// addresses; a failed lookup is an error naming the resolver's answer.
func lookup(args []string) error {
	if len(args) != 1 {
		return errors.New("lookup: want NAME")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, args[0])
	if err != nil {
		return err
	}
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		out = append(out, ip.IP.String())
	}
	slices.Sort(out)
	fmt.Printf("addrs=%s\n", strings.Join(out, ","))
	return nil
}
