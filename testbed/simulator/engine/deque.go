package engine

// deque is a ring buffer of requests: the waiting queue is FIFO, but
// preempted and LoRA-skipped requests go back to its front, as in vLLM.
type deque struct {
	buf  []*Request
	head int
	n    int
}

func (d *deque) len() int { return d.n }

func (d *deque) grow() {
	nb := make([]*Request, max(16, 2*len(d.buf)))
	for i := range d.n {
		nb[i] = d.buf[(d.head+i)%len(d.buf)]
	}
	d.buf, d.head = nb, 0
}

func (d *deque) pushBack(r *Request) {
	if d.n == len(d.buf) {
		d.grow()
	}
	d.buf[(d.head+d.n)%len(d.buf)] = r
	d.n++
}

func (d *deque) pushFront(r *Request) {
	if d.n == len(d.buf) {
		d.grow()
	}
	d.head = (d.head - 1 + len(d.buf)) % len(d.buf)
	d.buf[d.head] = r
	d.n++
}

func (d *deque) front() *Request { return d.buf[d.head] }

func (d *deque) popFront() *Request {
	r := d.buf[d.head]
	d.buf[d.head] = nil
	d.head = (d.head + 1) % len(d.buf)
	d.n--
	return r
}

func (d *deque) clear() {
	for d.n > 0 {
		d.popFront()
	}
}
