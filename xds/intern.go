package xds

// interner hands out one copy of each distinct string it is given. The
// decoder of a push uses one, so that the strings most workloads share with
// others (namespace, node, service account, trust domain, cluster, canonical
// name and revision, locality, service keys) are stored once per push rather
// than once per workload: a 100,000-workload push then leaves far fewer
// objects in the heap for every later garbage collection to mark. A nil
// interner returns its argument unchanged.
type interner map[string]string

// newInterner returns an empty interner.
func newInterner() interner { return make(interner) }

// str returns the interned copy of s, adding s if it is new.
func (in interner) str(s string) string {
	if in == nil || s == "" {
		return s
	}
	if c, ok := in[s]; ok {
		return c
	}
	in[s] = s
	return s
}

// strs interns every element of ss in place and returns ss.
func (in interner) strs(ss []string) []string {
	for i, s := range ss {
		ss[i] = in.str(s)
	}
	return ss
}

// bytes returns the interned copy of string(b), allocating a string only
// when b is new.
func (in interner) bytes(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if in == nil {
		return string(b)
	}
	if c, ok := in[string(b)]; ok {
		return c
	}
	s := string(b)
	in[s] = s
	return s
}
