package rbac

// NewIndexedSetForTest is NewSetFrom(nil, ps), but indexes however few policies ps
// holds, so that tests on small sets exercise the index.
func NewIndexedSetForTest(ps []*Policy) *Set { return newSetFrom(nil, ps, 0) }

// NewIndexedSetFromForTest is NewSetFrom, indexing however few policies ps
// holds.
func NewIndexedSetFromForTest(prev *Set, ps []*Policy) *Set { return newSetFrom(prev, ps, 0) }
