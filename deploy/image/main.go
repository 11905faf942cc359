// Command image builds gozt's container image from scratch around a static
// gozt binary and writes it as an image archive, with no base image to pull
// and no container daemon:
//
//	go run ./deploy/image -bin bin/gozt-linux-amd64 -o bin/gozt-image.tar
//
// which is what `make image` runs after building the binary with
// CGO_ENABLED=0 and -trimpath.
//
// # The image
//
// One layer, laid out as Istio's own ztunnel image (pilot/docker/Dockerfile.ztunnel
// in istio.io/istio), so Istio's ztunnel chart runs it unchanged:
//
//	/usr/local/bin/gozt               the binary, and the entrypoint
//	/usr/local/bin/ztunnel -> gozt    for anything that runs `ztunnel` by name
//	/tmp                              mode 1777; the chart mounts an emptyDir here
//
// The chart sets no command, only args `proxy ztunnel`, so the container
// runs `/usr/local/bin/gozt proxy ztunnel`. Cmd is those same args: ztunnel
// run with no arguments is the proxy, and gozt run with no arguments only
// prints its usage. The working directory is / so that ztunnel's relative
// default paths (./var/run/secrets/istio/root-cert.pem,
// ./var/run/secrets/tokens/istio-token) land on the chart's mounts. There is
// no USER: the chart runs the container as uid 0, gid 1337. There are no CA
// certificates: gozt trusts istiod through the root the chart mounts, and
// only XDS_ROOT_CA=SYSTEM or CA_ROOT_CA=SYSTEM would want the OS roots (mount
// a bundle and set SSL_CERT_FILE for that).
//
// # The archive
//
// The archive is an OCI image layout (oci-layout, index.json,
// blobs/sha256/...) with docker's manifest.json beside it pointing at the
// same blobs: the layout `docker save` itself writes since Docker 25.
// containerd's importer (`ctr images import`, and `kind load image-archive`,
// which runs it on every node) reads index.json and names the image from its
// io.containerd.image.name annotation; `docker load` with the classic image
// store reads manifest.json and its RepoTags, and with the containerd image
// store reads index.json. go-containerregistry's tarball package writes only
// the docker half and its layout package only a directory, so this command
// writes the tar itself from the image go-containerregistry built.
//
// The image is reproducible: file times and the creation time are the commit
// time of HEAD (or SOURCE_DATE_EPOCH, or the Unix epoch), so the same binary
// and commit give the same image digest.
//
// This command is a build tool: nothing imports it and it is never linked
// into gozt.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "image:", err)
		}
		os.Exit(2)
	}
}

// run parses the flags, builds the image and writes the archive.
func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("bin", "", "the static gozt binary to package (linux, CGO_ENABLED=0)")
	out := fs.String("o", "bin/gozt-image.tar", "where to write the image archive")
	version := fs.String("version", "", "the version label and default tag (default: ask the binary with `gozt version`; required when it cannot run here)")
	revision := fs.String("revision", "", "the source revision label (default: git's HEAD, when git is there)")
	tag := fs.String("tag", "", "the image reference recorded in the archive (default "+defaultRepo+":VERSION)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *bin == "" || fs.NArg() != 0 {
		fs.Usage()
		return errors.New("usage: image -bin FILE [-o FILE] [-version V] [-revision R] [-tag REF]")
	}
	meta, err := resolveMeta(*bin, *version, *revision, *tag)
	if err != nil {
		return err
	}
	img, err := build(meta)
	if err != nil {
		return err
	}
	if err := writeFile(*out, img, meta); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "image: wrote %s: %s (linux/%s)\n", *out, meta.ref, meta.arch)
	return nil
}
