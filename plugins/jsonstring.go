package plugins

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// A real prompt is not plain text as JSON writes it: every line break is a "\n" escape, every quotation mark a "\"",
// and code, markup and other languages bring "\t", "\u003c" and non-ASCII bytes. encoding/json decodes such a string
// a byte at a time, twice (its validation, then its decoding), through its scanner's state functions: at a 256 KB
// prompt with escapes that was ~90% of the parser's CPU, more than ten times the plain prompt's. unquoteString
// decodes a string the validation already accepted, copying the spans between escapes as they stand.

// unquoteString returns what encoding/json decodes the valid JSON string token v into (validJSON accepted it): its
// escapes decoded, a \u escape of half a surrogate pair without its other half as U+FFFD, and each byte that is not
// part of valid UTF-8 as U+FFFD (encoding/json's unquote; held to it by TestUnquoteStringAsUnmarshal and
// FuzzUnquoteString). A string without escapes is its bytes; another goes to unquoteValid, and a string that is not
// valid UTF-8 (which no client's encoder writes) to unquoteReplacing.
func unquoteString(v []byte) string {
	s := v[1 : len(v)-1]
	if bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
		return string(s) // a string without escapes: its bytes, read by the two fastest scans there are
	}
	if out, ok := unquoteValid(s); ok {
		return out
	}
	return unquoteReplacing(s)
}

// unquoteValid is unquoteString of the content s of a string of valid UTF-8; ok is false at the first byte that is
// not part of valid UTF-8. A prompt's escapes come every few dozen bytes, so the bytes
// between them are copied as they are read, a word at a time: each eight bytes read are stored where the output
// stands whether they all belong to it or not, and the output advances by the bytes that do (the next store
// overwrites the rest), instead of a copy call per span. A valid multi-byte character is copied the same way.
func unquoteValid(s []byte) (out string, ok bool) {
	buf := make([]byte, len(s)+8) // escapes only shorten; the eight bytes are the last store's overhang
	w := 0
	for i := 0; i < len(s); {
		for i+8 <= len(s) {
			x := binary.LittleEndian.Uint64(s[i:])
			binary.LittleEndian.PutUint64(buf[w:], x)
			if m := escapesOrNonASCII(x); m != 0 {
				k := bits.TrailingZeros64(m) / 8
				i, w = i+k, w+k
				break
			}
			i, w = i+8, w+8
		}
		for i < len(s) && s[i] != '\\' && s[i] < utf8.RuneSelf { // the last few bytes
			buf[w] = s[i]
			i, w = i+1, w+1
		}
		if i == len(s) {
			break
		}
		if c := s[i]; c != '\\' {
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				return "", false
			}
			w += copy(buf[w:], s[i:i+size])
			i += size
			continue
		}
		if e := s[i+1]; e != 'u' {
			buf[w] = jsonUnescape[e]
			i, w = i+2, w+1
			continue
		}
		var r rune
		r, i = unicodeEscape(s, i)
		w += utf8.EncodeRune(buf[w:], r) // at most 4 bytes for the 6 or 12 read
	}
	if w == 0 {
		return "", true
	}
	return unsafe.String(&buf[0], w), true // buf is not used again
}

// unquoteReplacing is unquoteString of the content s of a string that is not valid UTF-8: each byte that is not part
// of valid UTF-8 becomes U+FFFD, which is longer, so the output is appended to. The ASCII between escapes and
// multi-byte characters is found eight bytes at a time and copied in one append.
func unquoteReplacing(s []byte) string {
	var out strings.Builder
	out.Grow(len(s)) // Grow does not zero the buffer
	for i := 0; i < len(s); {
		j := i
		for j+8 <= len(s) {
			if m := escapesOrNonASCII(binary.LittleEndian.Uint64(s[j:])); m != 0 {
				j += bits.TrailingZeros64(m) / 8
				break
			}
			j += 8
		}
		for j < len(s) && s[j] != '\\' && s[j] < utf8.RuneSelf { // the last few bytes
			j++
		}
		out.Write(s[i:j])
		if i = j; i == len(s) {
			break
		}
		if s[i] != '\\' { // a multi-byte character, kept if it is valid UTF-8
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				out.WriteRune(utf8.RuneError)
			} else {
				out.Write(s[i : i+size])
			}
			i += size
			continue
		}
		if s[i+1] != 'u' {
			out.WriteByte(jsonUnescape[s[i+1]])
			i += 2
			continue
		}
		var r rune
		r, i = unicodeEscape(s, i)
		out.WriteRune(r)
	}
	return out.String()
}

// unicodeEscape decodes the \u escape at s[i] (validJSON checked it): the character, with the escape after it when
// the two are a surrogate pair, else U+FFFD for half a pair; next is the index after what it read.
func unicodeEscape(s []byte, i int) (r rune, next int) {
	r = hex4(s[i+2 : i+6])
	i += 6
	if !utf16.IsSurrogate(r) {
		return r, i
	}
	if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
		if pair := utf16.DecodeRune(r, hex4(s[i+2:i+6])); pair != unicode.ReplacementChar {
			return pair, i + 6
		}
	}
	return unicode.ReplacementChar, i
}

// escapesOrNonASCII marks, with its high bit, each of the eight bytes of x (little-endian) that is a backslash or not
// ASCII: the bytes at which unquoteString stops copying. The lowest mark is always the first such byte (see
// stringSpecials and byteMarks).
func escapesOrNonASCII(x uint64) uint64 {
	return (byteMarks(x, '\\') | x) & wordHighs
}

// jsonUnescape is the byte each one-character escape stands for (validJSON admits no others).
var jsonUnescape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// hex4 is the value of four hexadecimal digits (validJSON checked them).
func hex4(h []byte) rune {
	var r rune
	for _, c := range h[:4] {
		switch {
		case c <= '9':
			c -= '0'
		case c >= 'a':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}
