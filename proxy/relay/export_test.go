package relay

// Internals for the external tests (STYLE testing habit 12).
var (
	BufferSize = bufferSize
	GetBuffer  = getBuffer
	PutBuffer  = putBuffer
	IsBenign   = isBenign
	WriteFull  = writeFull
)

const (
	SmallSize   = smallSize
	MediumSize  = mediumSize
	LargeSize   = largeSize
	MediumAfter = mediumAfter
	LargeAfter  = largeAfter
	SpliceChunk = spliceChunk
)
