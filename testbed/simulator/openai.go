package simulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
)

// apiError is an error answered as OpenAI-style JSON, with vLLM's type names:
// {"error":{"message":..,"type":..,"param":..,"code":<status>}}.
type apiError struct {
	status  int
	errType string
	message string
	param   string // "" is JSON null
}

func (e *apiError) Error() string { return e.message }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, errType: "BadRequestError", message: fmt.Sprintf(format, args...), param: param}
}

func notFound(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusNotFound, errType: "NotFoundError", message: fmt.Sprintf(format, args...), param: param}
}

var (
	errInjected = &apiError{status: http.StatusInternalServerError, errType: "InternalServerError",
		message: "simulated internal server error (fault injection: error_rate)"}
	errShuttingDown = &apiError{status: http.StatusServiceUnavailable, errType: "ServiceUnavailableError",
		message: "the server is shutting down"}
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil { // only plain structs are written: a bug, not input
		panic(fmt.Sprintf("simulator: marshal response: %v", err))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, e *apiError) {
	var param *string
	if e.param != "" {
		param = &e.param
	}
	type body struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	}
	writeJSON(w, e.status, map[string]body{"error": {Message: e.message, Type: e.errType, Param: param, Code: e.status}})
}

// generationRequest is a parsed /v1/completions or /v1/chat/completions body,
// reduced to what the simulator uses; other OpenAI fields are accepted and
// ignored, as sampling does not change simulated timing.
type generationRequest struct {
	chat   bool
	model  string // "" means the base model, as vLLM defaults it
	prompt []uint32
	// maxTokens is the requested output length; 0 when unset.
	maxTokens    int
	stream       bool
	includeUsage bool
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type commonBody struct {
	Model         string         `json:"model"`
	MaxTokens     *int64         `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
	N             *int64         `json:"n"`
}

type completionBody struct {
	commonBody
	Prompt json.RawMessage `json:"prompt"`
}

type chatBody struct {
	commonBody
	Messages            []chatMessage `json:"messages"`
	MaxCompletionTokens *int64        `json:"max_completion_tokens"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	text    string
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// decodeJSON decodes one JSON object and rejects trailing data.
func decodeJSON(body []byte, v any) *apiError {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			// Field is a path through embedded structs: keep the JSON name.
			field := typeErr.Field[strings.LastIndexByte(typeErr.Field, '.')+1:]
			return badRequest(field, "invalid type for %q: expected %s, got JSON %s", field, typeErr.Type, typeErr.Value)
		}
		return badRequest("", "invalid JSON body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("", "invalid JSON body: trailing data after the request object")
	}
	return nil
}

func (c *commonBody) validate(maxTokens *int64, maxTokensParam string) (*generationRequest, *apiError) {
	g := &generationRequest{model: c.Model, stream: c.Stream}
	if c.N != nil && *c.N != 1 {
		return nil, badRequest("n", "n must be 1 (the simulator returns one choice), got %d", *c.N)
	}
	if maxTokens != nil {
		if *maxTokens < 1 || *maxTokens > math.MaxInt32 {
			return nil, badRequest(maxTokensParam, "%s must be at least 1, got %d", maxTokensParam, *maxTokens)
		}
		g.maxTokens = int(*maxTokens)
	}
	if c.StreamOptions != nil {
		if !c.Stream {
			return nil, badRequest("stream_options", "stream_options can only be defined when stream=true")
		}
		g.includeUsage = c.StreamOptions.IncludeUsage
	}
	return g, nil
}

// parseCompletion parses a /v1/completions body. prompt is a string, an
// array holding one string, or an array of token ids.
func parseCompletion(body []byte) (*generationRequest, *apiError) {
	var b completionBody
	if err := decodeJSON(body, &b); err != nil {
		return nil, err
	}
	g, aerr := b.validate(b.MaxTokens, "max_tokens")
	if aerr != nil {
		return nil, aerr
	}
	raw := bytes.TrimSpace(b.Prompt)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("prompt", "field required: prompt")
	}
	var text string
	var texts []string
	var ids []int64
	switch {
	case json.Unmarshal(raw, &text) == nil:
		g.prompt = ApproximateTokens(text)
	case json.Unmarshal(raw, &texts) == nil:
		if len(texts) != 1 {
			return nil, badRequest("prompt", "prompt must hold exactly one string (batched prompts are not simulated), got %d", len(texts))
		}
		g.prompt = ApproximateTokens(texts[0])
	case json.Unmarshal(raw, &ids) == nil:
		g.prompt = make([]uint32, len(ids))
		for i, id := range ids {
			if id < 0 || id > math.MaxUint32 {
				return nil, badRequest("prompt", "token id %d at index %d is out of range", id, i)
			}
			g.prompt[i] = uint32(id)
		}
	default:
		return nil, badRequest("prompt", "prompt must be a string, an array of one string or an array of token ids")
	}
	if len(g.prompt) == 0 {
		return nil, badRequest("prompt", "prompt must not be empty")
	}
	return g, nil
}

// parseChat parses a /v1/chat/completions body. Message content is a string
// or an array of text parts; the conversation is rendered with renderChat.
func parseChat(body []byte) (*generationRequest, *apiError) {
	var b chatBody
	if err := decodeJSON(body, &b); err != nil {
		return nil, err
	}
	maxTokens, param := b.MaxCompletionTokens, "max_completion_tokens"
	if maxTokens == nil {
		maxTokens, param = b.MaxTokens, "max_tokens"
	}
	g, aerr := b.validate(maxTokens, param)
	if aerr != nil {
		return nil, aerr
	}
	g.chat = true
	if len(b.Messages) == 0 {
		return nil, badRequest("messages", "field required: messages must be a non-empty array")
	}
	for i := range b.Messages {
		m := &b.Messages[i]
		if m.Role == "" {
			return nil, badRequest("messages", "messages[%d].role is required", i)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return nil, badRequest("messages", "messages[%d].content: %v", i, err)
		}
		m.text = text
	}
	g.prompt = ApproximateTokens(renderChat(b.Messages))
	return g, nil
}

func messageText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil // assistant turns with tool calls carry no content
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []contentPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or an array of content parts")
	}
	var b strings.Builder
	for j, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("part %d has type %q: only text parts are simulated", j, p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// Response bodies, field for field as vLLM writes them.

type usage struct {
	PromptTokens        int                 `json:"prompt_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	PromptTokensDetails promptTokensDetails `json:"prompt_tokens_details"`
}

type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
}

type chatChoice struct {
	Index        int         `json:"index"`
	Message      *chatOutput `json:"message,omitempty"`
	Delta        *chatOutput `json:"delta,omitempty"`
	Logprobs     any         `json:"logprobs"`
	FinishReason *string     `json:"finish_reason"`
	StopReason   any         `json:"stop_reason"`
}

type chatOutput struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type responseBody struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices any    `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
}

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}
