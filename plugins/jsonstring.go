package plugins

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// A real prompt is not plain text as JSON writes it: every line break is a "\n" escape, every quotation mark a "\"",
// and code, markup and other languages bring "\t", "\u003c" and non-ASCII bytes. encoding/json decodes such a string
// a byte at a time, twice (its validation, then its decoding), through its scanner's state functions: at a 256 KB
// prompt with escapes that was ~90% of the parser's CPU, more than ten times the plain prompt's. unquoteString
// decodes a string the validation already accepted, copying the spans between escapes as they stand.

// unquoteString returns what encoding/json decodes the valid JSON string token v into (validJSON accepted it): its
// escapes decoded, a \u escape of half a surrogate pair without its other half as U+FFFD, and each byte that is not
// part of valid UTF-8 as U+FFFD (encoding/json's unquote; held to it by TestUnquoteStringAsUnmarshal and
// FuzzUnquoteString). A prompt's escapes come every few dozen bytes, so the ASCII between them is found eight bytes
// at a time and copied in one append, without a call per span.
func unquoteString(v []byte) string {
	s := v[1 : len(v)-1]
	if bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
		return string(s) // a string without escapes: its bytes, read by the two fastest scans there are
	}
	var out strings.Builder
	out.Grow(len(s)) // escapes only shorten a string, only invalid UTF-8 lengthens it; Grow does not zero the buffer
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
		r := hex4(s[i+2 : i+6])
		i += 6
		if utf16.IsSurrogate(r) {
			if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
				if pair := utf16.DecodeRune(r, hex4(s[i+2:i+6])); pair != unicode.ReplacementChar {
					out.WriteRune(pair)
					i += 6
					continue
				}
			}
			r = unicode.ReplacementChar
		}
		out.WriteRune(r)
	}
	return out.String()
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
