package prefixcache

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
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
	dst = append(dst, domainText)
	return append(dst, prompt...)
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
	dst = append(dst, domainChat)
	if c.Tools != nil {
		tools, err := json.Marshal(c.Tools)
		if err != nil {
			return dst, fmt.Errorf("encoding chat tools: %w", err)
		}
		dst = append(dst, tagTools)
		dst = appendBytes(dst, tools)
	}
	for _, m := range c.Messages {
		dst = append(dst, tagMessage)
		dst = appendString(dst, m.Role)
		dst = binary.AppendUvarint(dst, uint64(len(m.Parts)))
		for _, p := range m.Parts {
			dst = appendString(dst, p.Kind)
			dst = appendString(dst, p.Value)
		}
	}
	return dst, nil
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendBytes(dst []byte, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}
