package prefixcache

// GuardAction is what the load guard did to a pod's affinity. Its values
// are a closed set, usable as metric labels.
type GuardAction uint8

const (
	// GuardNone kept the full affinity.
	GuardNone GuardAction = iota
	// GuardTaper reduced it: the pod is getting busier than the pool.
	GuardTaper
	// GuardOverload removed it: the pod is far above the pool's load.
	GuardOverload
	// GuardKVFull removed it: the pod's KV cache is nearly full.
	GuardKVFull
)

func (a GuardAction) String() string {
	switch a {
	case GuardNone:
		return "none"
	case GuardTaper:
		return "taper"
	case GuardOverload:
		return "overload"
	case GuardKVFull:
		return "kv_full"
	}
	return "unknown"
}

// weight is the factor applied to the affinity of a pod with the given
// load when the pool's mean load is mean (see GuardConfig).
//
// Why this spreads a hot prefix group: the group's holders are the pods
// that get its requests, so their load rises above the pool's; once the
// excess passes the taper start their affinity fades and the profile's
// load scorers pick a less loaded pod. Route records that pod as a holder
// too, so the group now has one more pod to spread over; it keeps growing
// while the holders cannot keep up, and stops when they can.
func (g GuardConfig) weight(load, mean, kvUtilization float64) (float64, GuardAction) {
	if kvUtilization >= g.KVCacheCutoff {
		return 0, GuardKVFull
	}
	excess := load - mean
	start := g.TaperStart * g.OverloadAbsolute
	if load < g.OverloadRelative*mean || excess <= start {
		return 1, GuardNone
	}
	if excess >= g.OverloadAbsolute {
		return 0, GuardOverload
	}
	return (g.OverloadAbsolute - excess) / (g.OverloadAbsolute - start), GuardTaper
}
