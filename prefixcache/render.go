package prefixcache

import (
	"encoding/json"
	"fmt"
	"unsafe"
)

// Chat is the part of a chat request that the model server turns into the
// prompt's prefix: tool definitions, then every message in order (a system
// prompt is the first message, as in the OpenAI API).
type Chat struct {
	// Tools are the request's tool definitions, as decoded from JSON
	// (maps, slices, strings, numbers, bools, nil).
	Tools any
	// Messages are the conversation, oldest first.
	Messages []Message
}

// Message is one turn of a conversation.
type Message struct {
	Role  string
	Parts []Part
}

// Part is one piece of a message's content: Kind is "text" for text and the
// OpenAI content-block type otherwise ("image_url", "input_audio", …), with
// Value the text, URL or data that identifies it.
type Part struct {
	Kind  string
	Value string
}

// Rendering domains: the first byte of every rendering, so that a
// completions prompt never shares blocks with a chat whose framing happens
// to spell the same bytes.
const (
	domainText byte = 't'
	domainChat byte = 'c'
)

// Chat framing tags.
const (
	tagTools   byte = 'T'
	tagMessage byte = 'M'
)

// AppendText appends the rendering of a completions-style prompt to dst.
func AppendText(dst []byte, prompt string) []byte {
	w := appendSink{dst: dst}
	renderText(&w, prompt)
	return w.dst
}

// AppendChat appends the canonical rendering of c to dst and fails only when
// c.Tools cannot be encoded as JSON.
//
// The rendering is a domain byte, then the tools (tag, length, JSON with
// object keys sorted), then each message (tag, role, part count, and each
// part's kind and value), every string length-prefixed. It is
//   - deterministic: equal chats render equal bytes;
//   - injective: different chats render different bytes (lengths make the
//     framing unambiguous, whatever the content holds);
//   - prefix-preserving: the rendering of a conversation is a prefix of the
//     rendering of any continuation with the same tools, so each turn of a
//     multi-turn chat shares the blocks of its history.
//
// Text dominates the length, so the token rule applies to it unchanged.
func AppendChat(dst []byte, c Chat) ([]byte, error) {
	tools, err := encodeTools(c.Tools)
	if err != nil {
		return dst, err
	}
	w := appendSink{dst: dst}
	renderChat(&w, c, tools)
	return w.dst, nil
}

// encodeTools is the JSON of a chat's tools (object keys sorted), nil for
// none.
func encodeTools(tools any) ([]byte, error) {
	if tools == nil {
		return nil, nil
	}
	b, err := json.Marshal(tools)
	if err != nil {
		return nil, fmt.Errorf("encoding chat tools: %w", err)
	}
	return b, nil
}

// sink receives a rendering piece by piece: appendSink joins it, a
// chainWriter hashes it without joining it.
type sink interface {
	writeByte(b byte)
	writeString(s string)
}

// renderChat writes c's rendering (see AppendChat) to w; tools is c.Tools
// encoded (encodeTools). It is the one definition of the chat rendering.
func renderChat(w sink, c Chat, tools []byte) {
	w.writeByte(domainChat)
	if c.Tools != nil {
		w.writeByte(tagTools)
		writeUvarint(w, uint64(len(tools)))
		w.writeString(unsafeString(tools))
	}
	for _, m := range c.Messages {
		w.writeByte(tagMessage)
		writeString(w, m.Role)
		writeUvarint(w, uint64(len(m.Parts)))
		for _, p := range m.Parts {
			writeString(w, p.Kind)
			writeString(w, p.Value)
		}
	}
}

// renderText writes AppendText's rendering of prompt to w.
func renderText(w sink, prompt string) {
	w.writeByte(domainText)
	w.writeString(prompt)
}

func writeString(w sink, s string) {
	writeUvarint(w, uint64(len(s)))
	w.writeString(s)
}

func writeUvarint(w sink, v uint64) {
	for v >= 0x80 {
		w.writeByte(byte(v) | 0x80)
		v >>= 7
	}
	w.writeByte(byte(v))
}

// unsafeString views b as a string without copying; b must not change
// while the string is in use.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// appendSink appends a rendering to dst.
type appendSink struct{ dst []byte }

func (a *appendSink) writeByte(b byte)     { a.dst = append(a.dst, b) }
func (a *appendSink) writeString(s string) { a.dst = append(a.dst, s...) }
