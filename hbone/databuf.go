package hbone

import "sync"

// Received DATA is kept in chunks taken from size-class pools, so an idle
// stream holds no buffer and a busy one holds at most its flow-control window.
// The pools hold pointers to arrays so that Put does not allocate (like x/net
// http2/databuffer.go). They are package-level like the stdlib's and x/net's
// buffer pools: they hold no configuration, only reusable memory.
var (
	chunkPool1k  = sync.Pool{New: func() any { return new([1 << 10]byte) }}
	chunkPool4k  = sync.Pool{New: func() any { return new([4 << 10]byte) }}
	chunkPool16k = sync.Pool{New: func() any { return new([16 << 10]byte) }}
	chunkPool64k = sync.Pool{New: func() any { return new([64 << 10]byte) }}
)

// largeChunkFill is how much of a chunk of the largest class is used:
// 65,464 bytes, one TCP segment on the loopback device (its MTU of 65,536
// less IPv6's 40-byte header, TCP's 20 and the timestamp option's 12; IPv4's
// segment is 19 bytes larger). A received chunk is written whole to the
// connection's destination, and in shared (in-pod) mode the legs to the
// application are loopback connections in the pod's network namespace, as
// are the bench's. A write of 65,536 bytes there is a full segment and a
// 53- or 72-byte one, which costs the two ends about 1.6× the CPU per byte
// of writes that fit one segment (BenchmarkLoopbackWriteSize, 2 cores:
// 0.66–0.71 against 0.38–0.45 CPU-s/GB for the same bytes). On a NIC, whose
// segments are smaller, the 72 bytes less change nothing.
const largeChunkFill = 65464

// getChunk returns a pooled buffer of the smallest class that holds n bytes,
// or of the largest class (largeChunkFill bytes of it) when n is larger.
func getChunk(n int) []byte {
	switch {
	case n <= 1<<10:
		return chunkPool1k.Get().(*[1 << 10]byte)[:]
	case n <= 4<<10:
		return chunkPool4k.Get().(*[4 << 10]byte)[:]
	case n <= 16<<10:
		return chunkPool16k.Get().(*[16 << 10]byte)[:]
	default:
		return chunkPool64k.Get().(*[64 << 10]byte)[:largeChunkFill]
	}
}

// putChunk returns a buffer obtained from getChunk to its pool.
func putChunk(b []byte) {
	switch cap(b) {
	case 1 << 10:
		chunkPool1k.Put((*[1 << 10]byte)(b[:1<<10]))
	case 4 << 10:
		chunkPool4k.Put((*[4 << 10]byte)(b[:4<<10]))
	case 16 << 10:
		chunkPool16k.Put((*[16 << 10]byte)(b[:16<<10]))
	case 64 << 10:
		chunkPool64k.Put((*[64 << 10]byte)(b[:64<<10]))
	}
}

// chunk is a pooled buffer holding unread bytes b[r:w].
type chunk struct {
	b    []byte
	r, w int
}

// dataBuffer is a FIFO of received bytes in pooled chunks. The zero value is
// empty and holds no memory. It is not safe for concurrent use.
type dataBuffer struct {
	chunks []chunk
	size   int
}

// Len returns the number of unread bytes.
func (d *dataBuffer) Len() int { return d.size }

// appendBytes copies p into the buffer, filling the last chunk first.
func (d *dataBuffer) appendBytes(p []byte) {
	d.size += len(p)
	if n := len(d.chunks); n > 0 {
		last := &d.chunks[n-1]
		k := copy(last.b[last.w:], p)
		last.w += k
		p = p[k:]
	}
	for len(p) > 0 {
		b := getChunk(len(p))
		k := copy(b, p)
		d.chunks = append(d.chunks, chunk{b: b, w: k})
		p = p[k:]
	}
}

// appendChunks moves filled chunks into the buffer; the buffer owns them
// afterwards.
func (d *dataBuffer) appendChunks(cs []chunk) {
	for _, c := range cs {
		if c.w == c.r {
			putChunk(c.b)
			continue
		}
		d.size += c.w - c.r
		d.chunks = append(d.chunks, c)
	}
}

// Read copies unread bytes into p and returns the chunks it emptied to their
// pools.
func (d *dataBuffer) Read(p []byte) int {
	n := 0
	for len(p) > 0 && len(d.chunks) > 0 {
		c := &d.chunks[0]
		k := copy(p, c.b[c.r:c.w])
		c.r += k
		n += k
		p = p[k:]
		if c.r == c.w {
			d.popFront()
		}
	}
	d.size -= n
	return n
}

// popChunk detaches the first chunk (the buffer must not be empty); its
// unread bytes no longer count in Len.
func (d *dataBuffer) popChunk() chunk {
	c := d.chunks[0]
	d.chunks[0] = chunk{}
	d.chunks = d.chunks[1:]
	if len(d.chunks) == 0 {
		d.chunks = nil
	}
	d.size -= c.w - c.r
	return c
}

// pushFront puts back a chunk detached by popChunk, ahead of the others.
func (d *dataBuffer) pushFront(c chunk) {
	d.chunks = append(d.chunks, chunk{})
	copy(d.chunks[1:], d.chunks)
	d.chunks[0] = c
	d.size += c.w - c.r
}

func (d *dataBuffer) popFront() {
	putChunk(d.chunks[0].b)
	d.chunks[0] = chunk{}
	d.chunks = d.chunks[1:]
	if len(d.chunks) == 0 {
		d.chunks = nil // drop the backing array: an idle stream holds nothing
	}
}

// reset discards every unread byte and returns how many there were.
func (d *dataBuffer) reset() int {
	n := d.size
	for _, c := range d.chunks {
		putChunk(c.b)
	}
	d.chunks, d.size = nil, 0
	return n
}
