package explain

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"

	"github.com/gozt/gozt/cmd/gozt/internal/configdump"
	"github.com/gozt/gozt/state"
)

// Output formats of Run.
const (
	formatJSON = "json"
	formatText = "text"
)

// Run implements
//
//	gozt explain --config-dump FILE --src IP[:port] [--identity SPIFFE] --dst IP:port [--network NAME] [--format json|text]
//
// It loads a saved /config_dump (gozt's or a real ztunnel's: the same
// SPEC §8.2 shape; keys other than workloads, services and policies, and
// unknown fields, are ignored), rebuilds the state from it, evaluates the
// query like the live /debug/authz does and prints the JSON Result, or a
// short human summary with --format text.
//
// An entry the dump holds that gozt would reject (an invalid workload or
// policy) is skipped with a warning on stderr, as the live state would
// reject it; a workload that references a skipped policy is then denied, as
// it would be live. Run returns an error for bad flags, an unreadable dump or
// a destination no workload has; a denied connection is not an error.
func Run(args []string, stdout, stderr io.Writer) error {
	o, err := parseArgs(args, stderr)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(o.dumpPath)
	if err != nil {
		return fmt.Errorf("gozt explain: %w", err)
	}
	snap, warnings, err := LoadDump(data)
	if err != nil {
		return fmt.Errorf("gozt explain: %s: %w", o.dumpPath, err)
	}
	for _, w := range warnings {
		fmt.Fprintf(stderr, "gozt explain: warning: skipped %v\n", w)
	}
	res, err := Explain(snap, o.query)
	if err != nil {
		return fmt.Errorf("gozt explain: %w", err)
	}
	if o.format == formatText {
		return res.WriteText(stdout)
	}
	out, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	_, err = stdout.Write(append(out, '\n'))
	return err
}

// runOptions are Run's parsed flags.
type runOptions struct {
	dumpPath string
	format   string
	query    Query
}

func parseArgs(args []string, stderr io.Writer) (runOptions, error) {
	fs := flag.NewFlagSet("gozt explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o runOptions
	fs.StringVar(&o.dumpPath, "config-dump", "", "saved /config_dump JSON file (required)")
	fs.StringVar(&o.format, "format", formatJSON, "output: json or text")
	params := map[string]*string{
		paramSrc:      fs.String(paramSrc, "", "client IP[:port] (required)"),
		paramIdentity: fs.String(paramIdentity, "", "client SPIFFE identity spiffe://td/ns/NS/sa/SA (omit for plaintext)"),
		paramDst:      fs.String(paramDst, "", "destination pod IP:target port (required)"),
		paramNetwork:  fs.String(paramNetwork, "", "destination network (default: the default network)"),
	}
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: gozt explain --config-dump FILE --src IP[:port] [--identity SPIFFE] --dst IP:port [flags]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("gozt explain: unexpected argument %q", fs.Arg(0))
	case o.format != formatJSON && o.format != formatText:
		return o, fmt.Errorf("gozt explain: --format %q: want json or text", o.format)
	case o.dumpPath == "":
		return o, errors.New("gozt explain: --config-dump: required")
	}
	v := url.Values{}
	for name, val := range params {
		if *val != "" {
			v.Set(name, *val)
		}
	}
	var err error
	o.query, err = ParseQuery(v)
	if qe, ok := errors.AsType[*QueryError](err); ok {
		return o, fmt.Errorf("gozt explain: --%s: %s", qe.Param, qe.Msg)
	}
	return o, err
}

// LoadDump rebuilds the node's state from config_dump JSON with
// configdump.Parse and the dump's converters. Each workload, service and
// policy is converted and inserted on its own: one that fails is left out
// and reported in skipped, so one odd entry in a real ztunnel's dump does not
// hide the rest. It fails when data is not a config dump or holds no
// workload. Workloads come back without their service memberships, which
// authorization does not use.
func LoadDump(data []byte) (snap *state.Snapshot, skipped []error, err error) {
	d, err := configdump.Parse(data)
	if err != nil {
		return nil, nil, err
	}
	if len(d.Workloads) == 0 {
		return nil, nil, errors.New("the config dump holds no workloads")
	}
	st := state.NewStore(state.Config{})
	st.Update(func(b *state.Batch) {
		for i := range d.Workloads {
			w, err := d.Workloads[i].Workload()
			if err == nil {
				err = b.InsertWorkload(w)
			}
			if err != nil {
				skipped = append(skipped, fmt.Errorf("workload %d (%s): %w", i, d.Workloads[i].UID, err))
			}
		}
		for i := range d.Services {
			s, err := d.Services[i].Service()
			if err == nil {
				err = b.InsertService(s)
			}
			if err != nil {
				skipped = append(skipped, fmt.Errorf("service %d (%s/%s): %w", i, d.Services[i].Namespace, d.Services[i].Hostname, err))
			}
		}
		for i := range d.Policies {
			p, err := d.Policies[i].Policy()
			if err == nil {
				err = b.InsertPolicy(p)
			}
			if err != nil {
				skipped = append(skipped, fmt.Errorf("policy %d (%s/%s): %w", i, d.Policies[i].Namespace, d.Policies[i].Name, err))
			}
		}
	})
	return st.Snapshot(), skipped, nil
}
