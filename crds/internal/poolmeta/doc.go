// Package poolmeta answers, for Sluice's reconcilers, whether the InferencePool their objects refer to exists. It
// reads only the pool's metadata (a PartialObjectMetadata get), so a reconciler needs no typed informer for pools and
// works with whichever InferencePool group the EPP serves.
package poolmeta
