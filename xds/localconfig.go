package xds

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// Limits on the local config (TESTPLAN S30: bound everything we parse).
const (
	maxLocalConfigSize = 16 << 20 // bytes
	// maxLocalConfigNodes bounds the YAML nodes visited, counting every
	// expansion of an alias, so an alias bomb fails fast.
	maxLocalConfigNodes = 1 << 20
)

// LocalConfig is the parsed local static config (SPEC §5.5).
type LocalConfig struct {
	Workloads []*state.Workload
	Services  []*state.Service
	Policies  []*rbac.Policy
	Raw       any // the document as parsed, for /config_dump "staticConfig"
}

// ConfigError is a problem at one place in a local config document. Its
// Error is one line: "name:line:col: key.path: reason".
type ConfigError struct {
	Name         string // file name or label given to ParseLocalConfig
	Line, Column int
	Path         string // dotted key path, e.g. workloads[0].workloadIps[1]; "(root)" for the document
	Reason       string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s: %s", e.Name, e.Line, e.Column, e.Path, e.Reason)
}

// LoadLocalConfig reads and parses the local config file at path.
func LoadLocalConfig(path string) (*LocalConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("xds: local config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxLocalConfigSize+1))
	if err != nil {
		return nil, fmt.Errorf("xds: local config: %w", err)
	}
	return ParseLocalConfig(path, data)
}

// ParseLocalConfig parses a local config document; name labels errors
// (usually the file name). Unknown keys anywhere, values of the wrong type
// or spelling, and missing required keys are errors (a *ConfigError). Unlike
// xDS, defaults for trust domain, service account and cluster id are not
// applied to the stored values. A workload without uid gets
// "namespace/name".
func ParseLocalConfig(name string, data []byte) (*LocalConfig, error) {
	if len(data) > maxLocalConfigSize {
		return nil, &ConfigError{Name: name, Line: 1, Column: 1, Path: rootPath,
			Reason: fmt.Sprintf("document larger than %d bytes", maxLocalConfigSize)}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return &LocalConfig{Raw: map[string]any{}}, nil
		}
		return nil, yamlError(name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, &ConfigError{Name: name, Line: extra.Line, Column: extra.Column, Path: rootPath,
			Reason: "more than one YAML document"}
	} else if !errors.Is(err, io.EOF) {
		return nil, yamlError(name, err)
	}
	p := &parser{name: name}
	cfg, err := p.config(&doc)
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

const rootPath = "(root)"

var yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlError turns a yaml.v3 syntax error into a one-line ConfigError.
func yamlError(name string, err error) error {
	msg := strings.ReplaceAll(err.Error(), "\n", "; ")
	line := 1
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	return &ConfigError{Name: name, Line: line, Column: 1, Path: rootPath, Reason: msg}
}

// Apply resets the batch and inserts every workload, service and policy of
// c. It returns the errors of any that the store rejected (which a config
// accepted by ParseLocalConfig should never produce); the rest are applied.
func (c *LocalConfig) Apply(b *state.Batch) error {
	b.Reset()
	var errs []error
	for _, w := range c.Workloads {
		errs = append(errs, b.InsertWorkload(w))
	}
	for _, s := range c.Services {
		errs = append(errs, b.InsertService(s))
	}
	for _, p := range c.Policies {
		errs = append(errs, b.InsertPolicy(p))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("xds: apply local config: %w", err)
	}
	return nil
}

// parser walks a yaml.v3 node tree. Every node is reached through node(),
// which resolves aliases and spends the visit budget.
type parser struct {
	name   string
	visits int
}

// fieldFn parses the value n of one mapping key at path.
type fieldFn func(n *yaml.Node, path string) error

func (p *parser) errorf(n *yaml.Node, path, format string, args ...any) error {
	return &ConfigError{Name: p.name, Line: n.Line, Column: n.Column, Path: path, Reason: fmt.Sprintf(format, args...)}
}

func (p *parser) node(n *yaml.Node, path string) (*yaml.Node, error) {
	for n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			return nil, p.errorf(n, path, "unresolved alias")
		}
		n = n.Alias
	}
	p.visits++
	if p.visits > maxLocalConfigNodes {
		return nil, p.errorf(n, path, "document too large (more than %d nodes after alias expansion)", maxLocalConfigNodes)
	}
	return n, nil
}

// describe names a node's type for error messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!int", "!!float", "!!bool":
			return n.Value
		}
		return strconv.Quote(n.Value)
	}
	return "an unsupported node"
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// keyPath appends a mapping key to path: ".key" for plain keys (a letter
// or '_', then letters, digits, '_' or '-'), else ["key"].
func keyPath(path, key string) string {
	plain := key != "" && !(key[0] >= '0' && key[0] <= '9') && key[0] != '-'
	for _, r := range key {
		if !(r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			plain = false
			break
		}
	}
	if path == rootPath {
		path = ""
	}
	if plain {
		if path == "" {
			return key
		}
		return path + "." + key
	}
	return path + "[" + strconv.Quote(key) + "]"
}

func indexPath(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// mapping parses a mapping node whose keys are all known: each key's value
// goes to its fieldFn; unknown, duplicate and missing required keys are
// errors. A null node is an empty mapping.
func (p *parser) mapping(n *yaml.Node, path string, fields map[string]fieldFn, required ...string) error {
	n, err := p.node(n, path)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	if !isNull(n) {
		if n.Kind != yaml.MappingNode {
			return p.errorf(n, path, "expected a mapping, got %s", describe(n))
		}
		err := p.pairs(n, path, func(k string, kn, v *yaml.Node) error {
			fn, ok := fields[k]
			if !ok {
				return p.errorf(kn, keyPath(path, k), "unknown key")
			}
			seen[k] = true
			return fn(v, keyPath(path, k))
		})
		if err != nil {
			return err
		}
	}
	for _, k := range required {
		if !seen[k] {
			return p.errorf(n, keyPath(path, k), "missing required key")
		}
	}
	return nil
}

// pairs calls fn for each key/value of mapping n, rejecting non-string and
// duplicate keys.
func (p *parser) pairs(n *yaml.Node, path string, fn func(k string, kn, v *yaml.Node) error) error {
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, err := p.node(n.Content[i], path)
		if err != nil {
			return err
		}
		if kn.Kind != yaml.ScalarNode || kn.ShortTag() == "!!merge" {
			return p.errorf(kn, path, "unsupported mapping key %s", describe(kn))
		}
		k := kn.Value
		if seen[k] {
			return p.errorf(kn, keyPath(path, k), "duplicate key")
		}
		seen[k] = true
		if err := fn(k, kn, n.Content[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// sequence calls fn for each element of a list node; null is an empty list.
func (p *parser) sequence(n *yaml.Node, path string, fn func(i int, v *yaml.Node, path string) error) error {
	n, err := p.node(n, path)
	if err != nil {
		return err
	}
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return p.errorf(n, path, "expected a list, got %s", describe(n))
	}
	for i, v := range n.Content {
		if err := fn(i, v, indexPath(path, i)); err != nil {
			return err
		}
	}
	return nil
}

// scalar returns the resolved scalar node n, rejecting other kinds.
func (p *parser) scalar(n *yaml.Node, path, want string) (*yaml.Node, error) {
	n, err := p.node(n, path)
	if err != nil {
		return nil, err
	}
	if n.Kind != yaml.ScalarNode {
		return nil, p.errorf(n, path, "expected %s, got %s", want, describe(n))
	}
	return n, nil
}

// str parses a string; null is "".
func (p *parser) str(n *yaml.Node, path string) (string, error) {
	n, err := p.scalar(n, path, "a string")
	if err != nil {
		return "", err
	}
	switch n.ShortTag() {
	case "!!str":
		return n.Value, nil
	case "!!null":
		return "", nil
	}
	return "", p.errorf(n, path, "expected a string, got %s", describe(n))
}

func (p *parser) strField(dst *string) fieldFn {
	return func(n *yaml.Node, path string) (err error) {
		*dst, err = p.str(n, path)
		return err
	}
}

func (p *parser) strList(dst *[]string) fieldFn {
	return func(n *yaml.Node, path string) error {
		return p.sequence(n, path, func(_ int, v *yaml.Node, path string) error {
			s, err := p.str(v, path)
			if err != nil {
				return err
			}
			*dst = append(*dst, s)
			return nil
		})
	}
}

func (p *parser) boolField(dst *bool) fieldFn {
	return func(n *yaml.Node, path string) error {
		n, err := p.scalar(n, path, "true or false")
		if err != nil {
			return err
		}
		switch n.ShortTag() {
		case "!!null":
			*dst = false
			return nil
		case "!!bool":
			return n.Decode(dst)
		}
		return p.errorf(n, path, "expected true or false, got %s", describe(n))
	}
}

// uint parses an unsigned integer up to max.
func (p *parser) uint(n *yaml.Node, path string, max uint64) (uint64, error) {
	n, err := p.scalar(n, path, "a number")
	if err != nil {
		return 0, err
	}
	var v int64
	if n.ShortTag() != "!!int" || n.Decode(&v) != nil {
		return 0, p.errorf(n, path, "expected an integer, got %s", describe(n))
	}
	if v < 0 || uint64(v) > max {
		return 0, p.errorf(n, path, "%d out of range (0-%d)", v, max)
	}
	return uint64(v), nil
}

func (p *parser) portField(dst *uint16) fieldFn {
	return func(n *yaml.Node, path string) error {
		v, err := p.uint(n, path, 65535)
		*dst = uint16(v)
		return err
	}
}

func (p *parser) uint32Field(dst *uint32) fieldFn {
	return func(n *yaml.Node, path string) error {
		v, err := p.uint(n, path, 1<<32-1)
		*dst = uint32(v)
		return err
	}
}

// enum is a uint8-based enum of state or rbac whose String() is its
// config spelling.
type enum interface {
	~uint8
	String() string
}

// enumField parses one of the spellings of first..last.
func enumField[T enum](p *parser, dst *T, first, last T) fieldFn {
	return func(n *yaml.Node, path string) error {
		v, err := parseEnumNode(p, n, path, first, last)
		*dst = v
		return err
	}
}

func parseEnumNode[T enum](p *parser, n *yaml.Node, path string, first, last T) (T, error) {
	s, err := p.str(n, path)
	if err != nil {
		return 0, err
	}
	var names []string
	for v := first; v >= first && v <= last; v++ {
		if v.String() == s {
			return v, nil
		}
		names = append(names, v.String())
	}
	return 0, p.errorf(n, path, "unknown value %q (want one of %s)", s, strings.Join(names, ", "))
}

// portMap parses a mapping servicePort → targetPort.
func (p *parser) portMap(n *yaml.Node, path string) (state.PortMap, error) {
	n, err := p.node(n, path)
	if err != nil {
		return nil, err
	}
	m := state.PortMap{}
	if isNull(n) {
		return m, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, p.errorf(n, path, "expected a mapping of port to port, got %s", describe(n))
	}
	err = p.pairs(n, path, func(k string, kn, v *yaml.Node) error {
		kp := keyPath(path, k)
		sp, err := strconv.ParseUint(k, 10, 64)
		if err != nil {
			return p.errorf(kn, kp, "service port %q is not a number", k)
		}
		if sp > 65535 {
			return p.errorf(kn, kp, "%d out of range (0-65535)", sp)
		}
		tp, err := p.uint(v, kp, 65535)
		if err != nil {
			return err
		}
		m[uint16(sp)] = uint16(tp)
		return nil
	})
	return m, err
}

// toAny converts the node tree to JSON-friendly values (map[string]any,
// []any, string, int64, uint64, float64, bool, nil) for config_dump.
func (p *parser) toAny(n *yaml.Node, path string) (any, error) {
	n, err := p.node(n, path)
	if err != nil {
		return nil, err
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return map[string]any{}, nil
		}
		return p.toAny(n.Content[0], path)
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		err := p.pairs(n, path, func(k string, _, v *yaml.Node) error {
			x, err := p.toAny(v, keyPath(path, k))
			m[k] = x
			return err
		})
		return m, err
	case yaml.SequenceNode:
		l := make([]any, 0, len(n.Content))
		for i, v := range n.Content {
			x, err := p.toAny(v, indexPath(path, i))
			if err != nil {
				return nil, err
			}
			l = append(l, x)
		}
		return l, nil
	}
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, p.errorf(n, path, "%v", err)
	}
	return v, nil
}
