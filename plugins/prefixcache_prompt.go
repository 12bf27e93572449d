package plugins

import (
	"encoding/json"
	"errors"

	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/sluice-gw/sluice/prefixcache"
)

// A request's prompt as the model server sees its prefix, rendered from upstream's parsed body for the prefix index:
// the rendering must put shared prefixes first and be identical for identical prompts, whatever API carried them.

// errNoPrompt means the request carries nothing a prefix cache keys on.
var errNoPrompt = errors.New("request has no prompt")

// prompt is the request's prompt, as the model server would see its prefix: a completions prompt as text; a chat as
// its tools and every message in order; a responses request as instructions (system), tools and input; a conversation
// as its items. It is hashed where it lies in upstream's parsed body, not rendered into a copy (prefixcache.ChatPrompt),
// and carries the request's chains (chains, nil for none), so that scoring and the insert after the pick hash it once.
func (p *PrefixCache) prompt(buf *prefixBuffers, req *fwksched.LLMRequest, chains *prefixcache.Chains) (prefixcache.Prompt, error) {
	if req == nil || req.Body == nil {
		return prefixcache.Prompt{}, errNoPrompt
	}
	b := req.Body
	salt := prefixcache.Salt{Model: req.TargetModel, CacheSalt: b.CacheSalt()}
	var out prefixcache.Prompt
	var err error
	switch {
	case b.ChatCompletions != nil:
		var tools any
		if len(b.ChatCompletions.Tools) > 0 {
			tools = b.ChatCompletions.Tools
		}
		out, err = prefixcache.ChatPrompt(salt, prefixcache.Chat{Tools: tools, Messages: chatMessages(buf, b.ChatCompletions.Messages)})
	case b.Completions != nil:
		out = prefixcache.TextPrompt(salt, b.Completions.Prompt.PlainText())
	case b.Responses != nil:
		out, err = prefixcache.ChatPrompt(salt, responsesChat(b.Responses))
	case b.Conversations != nil:
		msgs := make([]prefixcache.Message, 0, len(b.Conversations.Items))
		for _, it := range b.Conversations.Items {
			msgs = append(msgs, prefixcache.Message{Role: it.Role, Parts: anyParts(it.Type, it.Content)})
		}
		out, err = prefixcache.ChatPrompt(salt, prefixcache.Chat{Messages: msgs})
	case b.Embeddings != nil:
		if s, ok := b.Embeddings.Input.(string); ok {
			out = prefixcache.TextPrompt(salt, s)
		} else {
			var in []byte
			in, err = json.Marshal(b.Embeddings.Input)
			out = prefixcache.TextPrompt(salt, string(in))
		}
	default:
		return prefixcache.Prompt{}, errNoPrompt
	}
	if err != nil {
		return prefixcache.Prompt{}, err
	}
	out.Chains = chains
	return out, nil
}

// chatMessages converts chat messages into buf's reusable slices.
func chatMessages(buf *prefixBuffers, in []fwksched.Message) []prefixcache.Message {
	parts := buf.parts[:0]
	for _, m := range in {
		if m.Content.Raw != "" || m.Content.Structured == nil {
			parts = append(parts, prefixcache.Part{Kind: "text", Value: m.Content.Raw})
			continue
		}
		for _, blk := range m.Content.Structured {
			parts = append(parts, contentPart(blk))
		}
	}
	buf.parts = parts
	msgs := buf.messages[:0]
	next := 0
	for _, m := range in {
		n := 1
		if m.Content.Raw == "" && m.Content.Structured != nil {
			n = len(m.Content.Structured)
		}
		msgs = append(msgs, prefixcache.Message{Role: m.Role, Parts: parts[next : next+n : next+n]})
		next += n
	}
	buf.messages = msgs
	return msgs
}

// contentPart identifies one OpenAI content block by what the model sees.
func contentPart(b fwksched.ContentBlock) prefixcache.Part {
	switch b.Type {
	case "text":
		return prefixcache.Part{Kind: b.Type, Value: b.Text}
	case "image_url":
		return prefixcache.Part{Kind: b.Type, Value: b.ImageURL.Url}
	case "input_audio":
		return prefixcache.Part{Kind: b.Type, Value: b.InputAudio.Format + ":" + b.InputAudio.Data}
	case "video_url":
		return prefixcache.Part{Kind: b.Type, Value: b.VideoURL.Url}
	}
	return prefixcache.Part{Kind: b.Type, Value: b.Text}
}

// responsesChat maps a /v1/responses request onto a chat: instructions
// are the system prompt, input a user message or a list of items.
func responsesChat(r *fwksched.ResponsesRequest) prefixcache.Chat {
	c := prefixcache.Chat{Tools: r.Tools}
	if r.Instructions != nil {
		c.Messages = append(c.Messages, prefixcache.Message{Role: "system", Parts: anyParts("text", r.Instructions)})
	}
	switch in := r.Input.(type) {
	case []any:
		for _, it := range in {
			role := ""
			if m, ok := it.(map[string]any); ok {
				role, _ = m["role"].(string)
			}
			c.Messages = append(c.Messages, prefixcache.Message{Role: role, Parts: anyParts("item", it)})
		}
	default:
		c.Messages = append(c.Messages, prefixcache.Message{Role: "user", Parts: anyParts("text", in)})
	}
	return c
}

// anyParts renders decoded JSON content: a string as itself, anything
// else as its canonical JSON.
func anyParts(kind string, v any) []prefixcache.Part {
	if s, ok := v.(string); ok {
		return []prefixcache.Part{{Kind: kind, Value: s}}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return []prefixcache.Part{{Kind: kind}}
	}
	return []prefixcache.Part{{Kind: kind + "/json", Value: string(b)}}
}
