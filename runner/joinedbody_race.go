//go:build race

package runner

// poisonPutBack is true in race builds: a joined body's buffer is cleared as it is put back, so a test under -race
// that read a body after its release (putJoinedBuffer) reads zeros, not the prompt, and fails on it.
const poisonPutBack = true
