package runner

import (
	"math/bits"
	"sync"
)

// A long body reaches the EPP in several messages, which the model selection's hold joins into one (hold) for the
// selector and upstream's handler; upstream's handler then copies it into a buffer of its own as it reads it. The
// joined body lives from the hold until that copy, so its buffer is taken from a pool and put back as admission takes
// the request (joinedBodyReleasingAdmission), or else once upstream's handler has read past the message
// (modelSelection.joined): at a long prompt one body-sized allocation fewer per request, and the collections it
// triggered.

// joinedMinShift and joinedClasses are the pool's size classes: every power of two from 64 KiB to 64 MiB
// (DefaultModelSelectionMaxBodyBytes). A longer body takes a buffer of its own, as before.
const joinedMinShift, joinedClasses = 16, 11

var joinedBodies [joinedClasses]sync.Pool // of *[]byte, by class

// joinedBuffer returns a buffer of n bytes, from the pool when a class holds n. Its bytes are not zeroed: the join
// writes every one of them.
func joinedBuffer(n int) *[]byte {
	k := max(0, bits.Len(uint(n-1))-joinedMinShift)
	if k >= joinedClasses {
		b := make([]byte, n)
		return &b
	}
	if p, ok := joinedBodies[k].Get().(*[]byte); ok {
		*p = (*p)[:n]
		return p
	}
	b := make([]byte, n, 1<<(k+joinedMinShift))
	return &b
}

// putJoinedBuffer puts back a buffer from joinedBuffer, which nothing reads any more (cleared first in race builds,
// poisonPutBack).
func putJoinedBuffer(p *[]byte) {
	if poisonPutBack {
		clear(*p)
	}
	c := cap(*p)
	if k := bits.Len(uint(c)) - 1 - joinedMinShift; k >= 0 && k < joinedClasses && c == 1<<(k+joinedMinShift) {
		joinedBodies[k].Put(p)
	}
}

// joinInto concatenates the body chunks into a buffer from joinedBuffer; size is their total length.
func joinInto(chunks [][]byte, size int) *[]byte {
	p := joinedBuffer(size)
	n := 0
	for _, c := range chunks {
		n += copy((*p)[n:], c)
	}
	return p
}
