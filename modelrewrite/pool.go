package modelrewrite

// The pool reference defaults the API server applies (kubebuilder:default on
// PoolObjectReference); objects built in code may leave them empty.
const (
	DefaultPoolGroup = "inference.networking.k8s.io"
	PoolKind         = "InferencePool"
)
