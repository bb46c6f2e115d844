package models

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
)

// PromptHashes identifies the prompt of req, for a trace: template is
// the first 16 hex digits of the sha256 of its system prompt template
// (the content of its first message, when that is a system message; ""
// otherwise), full those of everything the model is sent: the messages
// (role, content, tool calls, tool results, images, privacy), the tool
// specs and the output schema (Format), each field length-prefixed. Two
// calls with the same full hash sent the model the same prompt; the same
// template hash, the same instructions. A provider's own additions
// (Ollama's tool instruction for a model without native tool calling)
// are not part of either. It reads the request once, without encoding
// it as JSON: a run hashes its whole, growing, context at every step.
func PromptHashes(req ChatRequest) (template, full string) {
	var p PromptHasher
	return p.Hashes(req)
}

// PromptHasher computes PromptHashes for the requests of one
// conversation, which grows at every step: it hashes only the messages
// added since its last call when the ones before are unchanged, and all
// of them again otherwise (older steps summarized, another conversation).
// It keeps a copy of each message it hashed, sharing their contents:
// callers must not change a request's messages in place. The zero value
// is ready to use; a PromptHasher is not safe for concurrent use.
type PromptHasher struct {
	msgs  []Message   // the messages hashed into state
	state hash.Cloner // sha256 of msgs
	buf   []byte      // reused by hashWriter
}

// Hashes returns PromptHashes(req).
func (p *PromptHasher) Hashes(req ChatRequest) (template, full string) {
	if len(req.Messages) > 0 && req.Messages[0].Role == RoleSystem {
		sum := sha256.Sum256([]byte(req.Messages[0].Content))
		template = hex.EncodeToString(sum[:8])
	}
	n := len(p.msgs)
	if p.state == nil || n > len(req.Messages) || !sameMessages(p.msgs, req.Messages[:n]) {
		p.state, p.msgs, n = sha256.New().(hash.Cloner), p.msgs[:0], 0
	}
	if p.buf == nil {
		p.buf = make([]byte, 0, 4096)
	}
	w := hashWriter{h: p.state, buf: p.buf[:0]}
	for _, m := range req.Messages[n:] {
		w.uint(1) // a message follows
		w.str(string(m.Role))
		w.str(m.Content)
		w.uint(uint64(len(m.ToolCalls)))
		for _, c := range m.ToolCalls {
			w.str(c.ID)
			w.str(c.Name)
			w.str(string(c.Arguments))
		}
		w.str(m.ToolCallID)
		w.str(m.ToolName)
		w.uint(uint64(len(m.Images)))
		for _, img := range m.Images {
			w.str(string(img))
		}
		if m.Private {
			w.uint(1)
		} else {
			w.uint(0)
		}
	}
	w.flush(true)
	p.msgs = append(p.msgs, req.Messages[n:]...)
	rest, err := p.state.Clone()
	if err != nil { // sha256 clones without fail
		rest = sha256.New().(hash.Cloner)
	}
	w = hashWriter{h: rest, buf: w.buf[:0]}
	w.uint(0) // no more messages
	w.uint(uint64(len(req.Tools)))
	for _, t := range req.Tools {
		w.str(t.Name)
		w.str(t.Version)
		w.str(t.Description)
		w.str(string(t.InputSchema))
		w.str(string(t.OutputSchema))
		w.str(string(t.SideEffects))
	}
	w.str(string(req.Format))
	return template, hex.EncodeToString(w.sum()[:8])
}

// sameMessages reports whether a and b hold the same messages. Strings
// that share their bytes compare at once, so a conversation's unchanged
// prefix costs little to check.
func sameMessages(a, b []Message) bool {
	for i := range a {
		x, y := &a[i], &b[i]
		if x.Role != y.Role || x.Content != y.Content || x.ToolCallID != y.ToolCallID || x.ToolName != y.ToolName || x.Private != y.Private ||
			len(x.ToolCalls) != len(y.ToolCalls) || len(x.Images) != len(y.Images) {
			return false
		}
		for j := range x.ToolCalls {
			c, d := x.ToolCalls[j], y.ToolCalls[j]
			if c.ID != d.ID || c.Name != d.Name || string(c.Arguments) != string(d.Arguments) {
				return false
			}
		}
		for j := range x.Images {
			if string(x.Images[j]) != string(y.Images[j]) {
				return false
			}
		}
	}
	return true
}

// hashWriter feeds a hash through a buffer, so that the many short
// fields of a request cost few calls to the hash.
type hashWriter struct {
	h   hash.Hash
	buf []byte
}

func (w *hashWriter) uint(n uint64) {
	w.buf = binary.AppendUvarint(w.buf, n)
	w.flush(false)
}

func (w *hashWriter) str(s string) {
	w.buf = binary.AppendUvarint(w.buf, uint64(len(s)))
	if len(s) > cap(w.buf)-len(w.buf) {
		w.flush(true)
		w.h.Write([]byte(s))
		return
	}
	w.buf = append(w.buf, s...)
	w.flush(false)
}

// flush writes the buffer to the hash when it is nearly full, or now.
func (w *hashWriter) flush(now bool) {
	if now || len(w.buf) > cap(w.buf)-64 {
		w.h.Write(w.buf)
		w.buf = w.buf[:0]
	}
}

func (w *hashWriter) sum() []byte {
	w.flush(true)
	return w.h.Sum(nil)
}
