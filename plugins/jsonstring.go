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
// prompt with escapes that was most of the parser's CPU, many times the plain prompt's. unquoteString checks and
// decodes a string in one read, copying the spans between escapes as they stand.

// unquoteString returns what encoding/json decodes the JSON string token v into: its escapes decoded, a \u escape of
// half a surrogate pair without its other half as U+FFFD, and each byte that is not part of valid UTF-8 as U+FFFD
// (encoding/json's unquote; held to it by TestUnquoteStringAsUnmarshal and FuzzUnquoteString). ok is false when v is
// not a valid JSON string: a control byte, or an escape JSON does not have. v is a token as skipString delimits it
// (its only unescaped quotes are its first and last bytes), whose content validJSONButLong may have left unchecked:
// checking while decoding reads a long prompt once instead of twice. A string without escapes is its bytes; another
// goes to unquoteValid, and a string that is not valid UTF-8 (which no client's encoder writes) to unquoteReplacing.
func unquoteString(v []byte) (string, bool) {
	s := v[1 : len(v)-1]
	if bytes.IndexByte(s, '\\') < 0 {
		if !noControlBytes(s) {
			return "", false
		}
		if utf8.Valid(s) {
			return string(s), true // a string without escapes: its bytes, read by the fastest scans there are
		}
		return unquoteReplacing(s), true
	}
	switch out, stop := unquoteValid(s); stop {
	case unquoted:
		return out, true
	case notJSON:
		return "", false
	}
	if _, ok := validString(v, 0); !ok { // unquoteReplacing decodes only valid strings
		return "", false
	}
	return unquoteReplacing(s), true
}

// unquoteStop is where unquoteValid stopped: at the end of its string, or at a byte it cannot decode.
type unquoteStop int

const (
	unquoted unquoteStop = iota // the whole string, decoded
	notUTF8                     // a byte that is not part of valid UTF-8: unquoteReplacing decodes the string
	notJSON                     // a control byte or an escape JSON does not have: the string is not JSON
)

// unquoteValid is unquoteString of the content s of a string with escapes, checked as it is decoded: it stops at the
// first byte that is not part of valid UTF-8 (notUTF8) or not valid in a JSON string (notJSON). A prompt's escapes
// come every few dozen bytes, so the bytes between them are copied as they are read, a word at a time: each eight
// bytes read are stored where the output stands whether they all belong to it or not, and the output advances by the
// bytes that do (the next store overwrites the rest), instead of a copy call per span. A valid multi-byte character is
// copied the same way.
func unquoteValid(s []byte) (out string, stop unquoteStop) {
	buf := make([]byte, len(s)+8) // escapes only shorten; the eight bytes are the last store's overhang
	w := 0
	for i := 0; i < len(s); {
		for i+8 <= len(s) {
			x := binary.LittleEndian.Uint64(s[i:])
			binary.LittleEndian.PutUint64(buf[w:], x)
			if m := unquoteStops(x); m != 0 {
				k := bits.TrailingZeros64(m) / 8
				i, w = i+k, w+k
				break
			}
			i, w = i+8, w+8
		}
		for i < len(s) && s[i] != '\\' && s[i] >= 0x20 && s[i] < utf8.RuneSelf { // the last few bytes
			buf[w] = s[i]
			i, w = i+1, w+1
		}
		if i == len(s) {
			break
		}
		switch c := s[i]; {
		case c < 0x20:
			return "", notJSON
		case c != '\\':
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				return "", notUTF8
			}
			w += copy(buf[w:], s[i:i+size])
			i += size
			continue
		}
		if i+1 == len(s) {
			return "", notJSON
		}
		if e := s[i+1]; e != 'u' {
			if jsonUnescape[e] == 0 {
				return "", notJSON
			}
			buf[w] = jsonUnescape[e]
			i, w = i+2, w+1
			continue
		}
		// unicodeEscape reads the escape, and the one after it if it is another \u escape (a surrogate's other half).
		if !validUnicodeEscape(s, i) || i+8 <= len(s) && s[i+6] == '\\' && s[i+7] == 'u' && !validUnicodeEscape(s, i+6) {
			return "", notJSON
		}
		var r rune
		r, i = unicodeEscape(s, i)
		w += utf8.EncodeRune(buf[w:], r) // at most 4 bytes for the 6 or 12 read
	}
	if w == 0 {
		return "", unquoted
	}
	return unsafe.String(&buf[0], w), unquoted // buf is not used again
}

// validUnicodeEscape reports whether s holds a \u escape with its four hexadecimal digits at i (s[i] is its backslash).
func validUnicodeEscape(s []byte, i int) bool {
	return i+6 <= len(s) && isHex(s[i+2]) && isHex(s[i+3]) && isHex(s[i+4]) && isHex(s[i+5])
}

// noControlBytes reports whether s has no byte below 0x20, which a JSON string may hold only escaped.
func noControlBytes(s []byte) bool {
	i := 0
	for ; i+8 <= len(s); i += 8 {
		if x := binary.LittleEndian.Uint64(s[i:]); (x-wordOnes*0x20)&^x&wordHighs != 0 {
			return false
		}
	}
	for ; i < len(s); i++ {
		if s[i] < 0x20 {
			return false
		}
	}
	return true
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
// ASCII: the bytes at which unquoteReplacing stops copying. The lowest mark is always the first such byte (see
// stringSpecials and byteMarks).
func escapesOrNonASCII(x uint64) uint64 {
	return (byteMarks(x, '\\') | x) & wordHighs
}

// unquoteStops is escapesOrNonASCII with the control bytes marked too: the bytes at which unquoteValid stops.
func unquoteStops(x uint64) uint64 {
	return (byteMarks(x, '\\') | x | (x-wordOnes*0x20)&^x) & wordHighs
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
