package engine

import (
	"fmt"
	"slices"
)

// noAdapter is the adapter id of requests for the base model.
const noAdapter int32 = -1

// loraSlots tracks LoRA adapters the way vLLM's scheduler and LRU GPU cache
// do together: at most max distinct adapters run in a step, an adapter must
// be resident in one of max GPU slots to run, and loading evicts the least
// recently used resident adapter that no running request uses.
//
// Invariants: distinctRunning == count of ids with running > 0 <= max;
// every id with running > 0 is resident; len(resident) <= max.
type loraSlots struct {
	max             int
	ids             map[string]int32
	names           []string
	resident        []int32 // LRU order: index 0 is least recently used
	running         []int32 // per id: running requests
	waiting         []int32 // per id: waiting requests
	unloadPending   []bool  // per id: evict once idle
	distinctRunning int
	loads           uint64
}

func newLoRASlots(max int) *loraSlots {
	return &loraSlots{max: max, ids: make(map[string]int32)}
}

// intern maps an adapter name to a small id; "" is the base model.
func (l *loraSlots) intern(name string) int32 {
	if name == "" {
		return noAdapter
	}
	if id, ok := l.ids[name]; ok {
		return id
	}
	id := int32(len(l.names))
	l.ids[name] = id
	l.names = append(l.names, name)
	l.running = append(l.running, 0)
	l.waiting = append(l.waiting, 0)
	l.unloadPending = append(l.unloadPending, false)
	return id
}

// canRun reports whether a request for id may join the running batch.
func (l *loraSlots) canRun(id int32) bool {
	return id == noAdapter || l.running[id] > 0 || l.distinctRunning < l.max
}

func (l *loraSlots) isResident(id int32) bool { return slices.Contains(l.resident, id) }

// acquire counts a running request for id, making id resident; it reports
// whether that took a load. The caller has checked canRun.
func (l *loraSlots) acquire(id int32) (loaded bool) {
	if id == noAdapter {
		return false
	}
	if l.running[id] == 0 {
		l.distinctRunning++
	}
	l.running[id]++
	l.unloadPending[id] = false
	if i := slices.Index(l.resident, id); i >= 0 {
		l.resident = append(slices.Delete(l.resident, i, i+1), id)
		return false
	}
	l.makeRoom()
	l.resident = append(l.resident, id)
	l.loads++
	return true
}

// makeRoom evicts the least recently used idle adapter when all slots are
// taken. canRun guarantees one is idle.
func (l *loraSlots) makeRoom() {
	if len(l.resident) < l.max {
		return
	}
	for i, r := range l.resident {
		if l.running[r] == 0 {
			l.resident = slices.Delete(l.resident, i, i+1)
			return
		}
	}
	panic("engine: no idle LoRA slot although canRun allowed the request")
}

func (l *loraSlots) release(id int32) {
	if id == noAdapter {
		return
	}
	l.running[id]--
	if l.running[id] == 0 {
		l.distinctRunning--
		if l.unloadPending[id] {
			l.evict(id)
		}
	}
}

func (l *loraSlots) evict(id int32) {
	if i := slices.Index(l.resident, id); i >= 0 {
		l.resident = slices.Delete(l.resident, i, i+1)
	}
	l.unloadPending[id] = false
}

// preload makes name resident without a request, evicting an idle adapter
// if needed. It does not count as a load.
func (l *loraSlots) preload(name string) error {
	if l.max == 0 {
		return fmt.Errorf("cannot preload LoRA adapter %q: max-loras is 0", name)
	}
	id := l.intern(name)
	if l.isResident(id) {
		return nil
	}
	if len(l.resident) == l.max && l.distinctRunning == l.max {
		return fmt.Errorf("cannot preload LoRA adapter %q: all %d slots hold adapters in use", name, l.max)
	}
	l.makeRoom()
	l.resident = append(l.resident, id)
	return nil
}

// unload evicts name now if idle, or once its running requests finish.
func (l *loraSlots) unload(name string) {
	id, ok := l.ids[name]
	if !ok {
		return
	}
	if l.running[id] > 0 {
		l.unloadPending[id] = true
		return
	}
	l.evict(id)
}

// namesWhere returns the sorted names of ids for which count > 0.
func (l *loraSlots) namesWhere(count []int32) []string {
	var out []string
	for id, c := range count {
		if c > 0 {
			out = append(out, l.names[id])
		}
	}
	slices.Sort(out)
	return out
}

func (l *loraSlots) residentNames() []string {
	out := make([]string, 0, len(l.resident))
	for _, id := range l.resident {
		out = append(out, l.names[id])
	}
	slices.Sort(out)
	return out
}
