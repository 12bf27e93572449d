package plugins

import (
	"encoding/binary"
	"math/bits"
)

// A long prompt is one long JSON string, and json.Valid reads it a byte at a time through encoding/json's scanner, a
// function call per byte: at long prompts the largest part of the parser's CPU. validJSON accepts exactly what
// json.Valid accepts and reads a string's content eight bytes at a time, stopping only at a quote, a backslash or a
// control byte.

// maxJSONDepth is encoding/json's limit on nested arrays and objects.
const maxJSONDepth = 10000

// validJSON reports whether b is one JSON value with optional surrounding whitespace, as json.Valid does: the
// grammar of RFC 8259, at most maxJSONDepth nested arrays and objects, strings without control bytes whose escapes
// are valid (their other bytes, valid UTF-8 or not, are accepted).
func validJSON(b []byte) bool {
	_, _, ok := validJSONButLong(b, -1)
	return ok
}

// validJSONButLong is validJSON, except that of a string value of longFrom bytes or more (none if longFrom is
// negative) it checks only where it ends, as skipString finds it, and returns where each such string starts, and in
// ends its length (the scans after it need not find its end again): b is valid JSON if and only if ok is true and
// each of those strings is (validString, or a decoding that checks as it goes: unquoteString). A prompt's string is
// then read once, by its decoding, not also by validString.
func validJSONButLong(b []byte, longFrom int) (unchecked []int, ends stringEnds, ok bool) {
	var open []byte // '{' or '[' of each array and object the value at i is in
	i := skipSpace(b, 0)
	for {
		// A value starts at i.
		if i >= len(b) {
			return nil, nil, false
		}
		ok = true
		switch c := b[i]; {
		case c == '{' || c == '[':
			if len(open) >= maxJSONDepth {
				return nil, nil, false
			}
			end := byte('}')
			if c == '[' {
				end = ']'
			}
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == end {
				i++
				break
			}
			open = append(open, c)
			if c == '{' {
				if i, ok = validMemberKey(b, i); !ok {
					return nil, nil, false
				}
			}
			continue
		case c == '"':
			if longFrom >= 0 {
				if end, closed := stringEnd(b, i); closed && end-i >= longFrom {
					if ends == nil {
						ends = stringEnds{}
					}
					unchecked, ends[&b[i]] = append(unchecked, i), end-i
					i = end
					break
				}
			}
			i, ok = validString(b, i)
		case c == '-' || c >= '0' && c <= '9':
			i, ok = validNumber(b, i)
		case c == 't':
			i, ok = validLiteral(b, i, "true")
		case c == 'f':
			i, ok = validLiteral(b, i, "false")
		case c == 'n':
			i, ok = validLiteral(b, i, "null")
		default:
			return nil, nil, false
		}
		if !ok {
			return nil, nil, false
		}
		// A value ended at i: close the arrays and objects it ends, up to the next member or element.
		for {
			i = skipSpace(b, i)
			if len(open) == 0 {
				return unchecked, ends, i == len(b)
			}
			if i >= len(b) {
				return nil, nil, false
			}
			inObject := open[len(open)-1] == '{'
			if b[i] == ',' {
				i = skipSpace(b, i+1)
				if inObject {
					if i, ok = validMemberKey(b, i); !ok {
						return nil, nil, false
					}
				}
				break
			}
			if inObject && b[i] != '}' || !inObject && b[i] != ']' {
				return nil, nil, false
			}
			open = open[:len(open)-1]
			i++
		}
	}
}

// validMemberKey checks an object member's key and colon at b[i] and returns the index after the whitespace that
// follows the colon.
func validMemberKey(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return i, false
	}
	i, ok := validString(b, i)
	if !ok {
		return i, false
	}
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return i, false
	}
	return skipSpace(b, i+1), true
}

// validString checks the JSON string at b[i] (b[i] is its opening quote) and returns the index after it.
func validString(b []byte, i int) (int, bool) {
	for i++; ; {
		for i+8 <= len(b) {
			if m := stringSpecials(binary.LittleEndian.Uint64(b[i:])); m != 0 {
				i += bits.TrailingZeros64(m) / 8 // the first special byte: a prompt's escapes come every few dozen bytes
				break
			}
			i += 8
		}
		if i >= len(b) {
			return i, false
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c < 0x20:
			return i, false
		case c == '\\':
			if i+1 >= len(b) {
				return i, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return i, false
				}
				i += 6
			default:
				return i, false
			}
		default:
			i++
		}
	}
}

// stringSpecials marks, with its high bit, each of the eight bytes of x (little-endian) that is a quote, a backslash
// or a control byte (below 0x20): the bytes at which validString stops. Each test is the classic "has a byte less
// than n" bit trick, exact for n up to 0x80 in that a mark is set if there is such a byte; a borrow may also mark a
// byte above a true one, never below, so the lowest mark is always the first such byte.
func stringSpecials(x uint64) uint64 {
	return ((x-wordOnes*0x20)&^x | byteMarks(x, '"') | byteMarks(x, '\\')) & wordHighs
}

// wordOnes has a one in each byte of a word, wordHighs the high bit of each: the constants of the word-at-a-time scans
// (stringSpecials, escapesOrNonASCII, compactSpecials).
const wordOnes, wordHighs = 0x0101010101010101, 0x8080808080808080

// byteMarks marks, with its high bit once masked with wordHighs, each byte of x equal to c: the "has a zero byte" bit
// trick on x xor c in every byte. A borrow may also mark a byte above a true one, never below.
func byteMarks(x uint64, c byte) uint64 {
	y := x ^ (wordOnes * uint64(c))
	return (y - wordOnes) &^ y
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c|0x20 >= 'a' && c|0x20 <= 'f'
}

// validNumber checks the JSON number at b[i] and returns the index after it.
func validNumber(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i+1)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		start := i + 1
		if i = skipDigits(b, start); i == start {
			return i, false
		}
	}
	if i < len(b) && b[i]|0x20 == 'e' {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		start := i
		if i = skipDigits(b, start); i == start {
			return i, false
		}
	}
	return i, true
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// validLiteral checks that b holds lit at i and returns the index after it.
func validLiteral(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, false
	}
	return i + len(lit), true
}
