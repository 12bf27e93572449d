//go:build !race

package runner

// poisonPutBack is false outside race builds: a put-back buffer keeps its bytes until the next join overwrites them.
const poisonPutBack = false
