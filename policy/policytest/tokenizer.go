package policytest

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"strings"
	"unicode"
	"unicode/utf8"

	"legato/rl/schema"
)

// Token ids of the fake vocabulary. Words hash into [0, wordVocab); the
// specials sit above it, where Qwen's chat template puts them.
const (
	wordVocab  = 151643
	imStartID  = 151644
	imEndID    = 151645
	imagePadID = 151655
)

// pieces splits text the way byte-pair tokenizers roughly do: a word or a
// number with its leading space, a run of newlines, a run of spaces, or one
// other character. Joining the pieces gives back the text, and equal texts
// always give equal pieces.
func pieces(s string) []string {
	var out []string
	for i := 0; i < len(s); {
		start := i
		r, n := utf8.DecodeRuneInString(s[i:])
		i += n
		switch {
		case r == ' ' && i < len(s) && isWordRune(firstRune(s[i:])):
			i = skipWord(s, i)
		case isWordRune(r):
			i = skipWord(s, i)
		case r == '\n':
			for i < len(s) && s[i] == '\n' {
				i++
			}
		case r == ' ':
			for i < len(s) && s[i] == ' ' && !(i+1 < len(s) && isWordRune(firstRune(s[i+1:]))) {
				i++
			}
		}
		out = append(out, s[start:i])
	}
	return out
}

func firstRune(s string) rune {
	r, _ := utf8.DecodeRuneInString(s)
	return r
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' }

func skipWord(s string, i int) int {
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !isWordRune(r) {
			break
		}
		i += n
	}
	return i
}

func hashString(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

func mix(a, b uint64) uint64 {
	h := fnv.New64a()
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], a)
	binary.LittleEndian.PutUint64(buf[8:], b)
	h.Write(buf[:])
	return h.Sum64()
}

// tokenID is the id of one piece.
func tokenID(piece string) int64 { return int64(hashString(piece) % wordVocab) }

// logprob is the log-probability the fake model gives the token id at
// position pos of a reply: deterministic, negative, a multiple of 0.001 in
// [-4, -0.001].
func logprob(id int64, pos int) float64 {
	return -float64(1+mix(uint64(id), uint64(pos))%4000) / 1000
}

// promptTokens is the fake chat template applied to msgs: every message is
// <|im_start|>role\n content <|im_end|>\n, and the prompt ends with the
// generation prompt <|im_start|>assistant\n. So the prompt of a call that
// only adds messages extends the prompt of the previous call, as with a real
// template. ids are what a server reports; keys are what its prefix cache
// hashes: equal to ids for text, derived from the image's content for image
// tokens (every image token has the same id, as in Qwen-VL).
func promptTokens(msgs []schema.Message, imageTokens int) (ids []int64, keys []uint64) {
	add := func(id int64) {
		ids = append(ids, id)
		keys = append(keys, uint64(id))
	}
	addText := func(s string) {
		for _, p := range pieces(s) {
			add(tokenID(p))
		}
	}
	for _, m := range msgs {
		add(imStartID)
		addText(m.Role + "\n")
		for _, p := range m.Content {
			switch {
			case p.ImageURL != nil:
				sum := sha256.Sum256([]byte(p.ImageURL.URL))
				seed := binary.LittleEndian.Uint64(sum[:8])
				for i := range imageTokens {
					ids = append(ids, imagePadID)
					keys = append(keys, mix(seed, uint64(i))|1<<63)
				}
			default:
				addText(p.Text)
			}
		}
		add(imEndID)
		addText("\n")
	}
	add(imStartID)
	addText("assistant\n")
	return ids, keys
}

// Token is one generated token as the server reports it.
type Token struct {
	ID int64
	// Text is the token's string in the logprobs: the token decoded on
	// its own, so U+FFFD for a byte of a character split across tokens,
	// and "<|im_end|>" for the end-of-turn token.
	Text    string
	Logprob float64
}

// genToken is a generated token and the bytes it adds to the reply's text:
// none for the end-of-turn token.
type genToken struct {
	Token
	bytes string
}

// EndOfTurn is the id of Qwen's <|im_end|>, the token a reply ends with.
const EndOfTurn = imEndID

// Tokenize returns the tokens the server generates for reply text, the
// end-of-turn token last, so tests can check what a client recorded against
// what was sent. Like a real server, the end-of-turn token is counted in
// completion_tokens and in the ids, and left out of the text.
func Tokenize(reply string) []Token {
	gen := generate(reply)
	out := make([]Token, len(gen))
	for i, t := range gen {
		out[i] = t.Token
	}
	return out
}

func generate(reply string) []genToken {
	var out []genToken
	add := func(id int64, text, bytes string) {
		out = append(out, genToken{Token{ID: id, Text: text, Logprob: logprob(id, len(out))}, bytes})
	}
	for _, p := range pieces(reply) {
		if r, n := utf8.DecodeRuneInString(p); n == len(p) && n >= 3 && !isWordRune(r) {
			// Byte-level tokenizers keep rare characters as their bytes:
			// each byte token decodes alone to U+FFFD.
			for i := range len(p) {
				add(tokenID(fmt.Sprintf("<0x%02X>", p[i])), "\uFFFD", p[i:i+1])
			}
			continue
		}
		text := p
		if !utf8.ValidString(p) {
			text = "\uFFFD"
		}
		add(tokenID(p), text, p)
	}
	add(imEndID, "<|im_end|>", "")
	return out
}

// spelled is the reply text tokens spell: their bytes, less a last character
// cut short (a reply stopped by max_tokens mid-character), which a server's
// incremental detokenizer holds back.
func spelled(toks []genToken) string {
	var b strings.Builder
	for _, t := range toks {
		b.WriteString(t.bytes)
	}
	s := b.String()
	for i := len(s) - 1; i >= 0 && i >= len(s)-3; i-- {
		if utf8.RuneStart(s[i]) {
			if !utf8.FullRuneInString(s[i:]) {
				s = s[:i]
			}
			break
		}
	}
	return s
}
