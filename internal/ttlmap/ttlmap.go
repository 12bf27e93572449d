package ttlmap

import (
	"container/list"
	"time"
)

// Map holds values by key until they expire, ttl after they were stored. The zero value is not usable; see New.
type Map[K comparable, V any] struct {
	ttl      time.Duration
	onExpire func(K, V)
	entries  map[K]*list.Element // values are *entry[K, V]
	order    list.List           // oldest first, which is expiry order
}

type entry[K comparable, V any] struct {
	key     K
	value   V
	expires time.Time
}

// New returns an empty Map whose entries expire ttl after they are stored. onExpire, if not nil, is called with each
// entry that expires (not with entries removed by Delete, Take or DropOldest).
func New[K comparable, V any](ttl time.Duration, onExpire func(K, V)) *Map[K, V] {
	return &Map[K, V]{ttl: ttl, onExpire: onExpire, entries: map[K]*list.Element{}}
}

// Put expires what is due at now and stores v under k until now+ttl. It returns the value k held before, if any: the
// new entry replaces it and moves to the back of the expiry order.
func (m *Map[K, V]) Put(now time.Time, k K, v V) (old V, replaced bool) {
	m.Expire(now)
	if el, ok := m.entries[k]; ok {
		old, replaced = m.remove(el).value, true
	}
	m.entries[k] = m.order.PushBack(&entry[K, V]{key: k, value: v, expires: now.Add(m.ttl)})
	return old, replaced
}

// Get expires what is due at now and returns k's value.
func (m *Map[K, V]) Get(now time.Time, k K) (V, bool) {
	m.Expire(now)
	if el, ok := m.entries[k]; ok {
		return el.Value.(*entry[K, V]).value, true
	}
	var zero V
	return zero, false
}

// Update expires what is due at now and, when k has a value, hands fn a pointer to it to change in place; the entry
// keeps its age and its place in the expiry order. It reports whether k had a value.
func (m *Map[K, V]) Update(now time.Time, k K, fn func(*V)) bool {
	m.Expire(now)
	el, ok := m.entries[k]
	if ok {
		fn(&el.Value.(*entry[K, V]).value)
	}
	return ok
}

// Take expires what is due at now, then removes k's entry and returns its value.
func (m *Map[K, V]) Take(now time.Time, k K) (V, bool) {
	m.Expire(now)
	return m.Delete(k)
}

// Delete removes k's entry, whatever its age, and returns its value.
func (m *Map[K, V]) Delete(k K) (V, bool) {
	if el, ok := m.entries[k]; ok {
		return m.remove(el).value, true
	}
	var zero V
	return zero, false
}

// DropOldest removes the entry that would expire first and returns it; ok is false when the map is empty.
func (m *Map[K, V]) DropOldest() (k K, v V, ok bool) {
	el := m.order.Front()
	if el == nil {
		return k, v, false
	}
	e := m.remove(el)
	return e.key, e.value, true
}

// Expire removes every entry stored ttl or longer before now, oldest first, handing each to onExpire.
func (m *Map[K, V]) Expire(now time.Time) {
	for el := m.order.Front(); el != nil && !now.Before(el.Value.(*entry[K, V]).expires); el = m.order.Front() {
		e := m.remove(el)
		if m.onExpire != nil {
			m.onExpire(e.key, e.value)
		}
	}
}

// Len returns the number of entries, including those due to expire at the next call that takes now.
func (m *Map[K, V]) Len() int { return m.order.Len() }

func (m *Map[K, V]) remove(el *list.Element) *entry[K, V] {
	e := el.Value.(*entry[K, V])
	delete(m.entries, e.key)
	m.order.Remove(el)
	return e
}
