package grade

// eval() of what gsettings prints for a list of strings: "['a', 'b']\n",
// "@as []\n" for an empty one (GVariant's typed empty array), nothing or an
// error text when the schema or key is missing. The native version reads
// the Python literals such output can be and raises what CPython raises on
// the texts that are not Python (a SyntaxError, or IndentationError);
// everything else CPython could evaluate (a name, a number, an operator, a
// nested list) it refuses with an error of its own, so that a grade it
// cannot follow fails instead of scoring differently.
//
// Source text goes through Python's tokenizer rules (lexPy), then the
// subset's grammar (evalParser). Because CPython compiles the whole text
// before evaluating any of it, a text holds a SyntaxError when any part of
// it is certainly one: a token Python has no rule for, an unterminated
// string, unbalanced brackets, two operands with no operator between them
// ("No such schema"), an operator no expression starts with ("@as []"),
// a second logical line. Which of SyntaxError and IndentationError is
// raised depends on what CPython's parser meets first; where that is not
// certain the text is refused.

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"legato/rl/desktop/osworld/grade/pystr"
)

// errEvalUnsupported is the native eval's refusal of a text CPython would
// evaluate, or whose error it cannot tell.
type errEvalUnsupported struct{ text string }

func (e *errEvalUnsupported) Error() string {
	return fmt.Sprintf("eval(%s): the native grader evaluates only a str, list or tuple of str literals; "+
		"grade this task with OSWorld's Python (--osworld DIR, an OSWorld checkout, and --grader bridge)", pyShort(e.text))
}

// pyShort is repr(s), cut to a length that fits in an error.
func pyShort(s string) string {
	const limit = 200
	if len(s) <= limit {
		return pystr.Repr(s)
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return pystr.Repr(s[:cut]) + "..."
}

// pyEvalStrings is eval(v) where v should hold a str, list or tuple of str
// literals; a tuple is returned as a list (len and set() treat them alike).
func pyEvalStrings(v any) (any, error) {
	src, ok := v.(string)
	if !ok {
		return nil, raise("TypeError", "eval() arg 1 must be a string, bytes or code object")
	}
	// eval() encodes the text to UTF-8 first, which a lone surrogate
	// fails, then refuses a NUL.
	pos := 0
	for i := 0; i < len(src); pos++ {
		r, n := pystr.DecodeRune(src[i:])
		if r >= 0xD800 && r <= 0xDFFF {
			return nil, raise("UnicodeEncodeError", "'utf-8' codec can't encode character '\\u%04x' in position %d: surrogates not allowed", r, pos)
		}
		i += n
	}
	if strings.IndexByte(src, 0) >= 0 {
		return nil, raise("SyntaxError", "source code string cannot contain null bytes")
	}
	// eval() skips leading spaces and tabs; the tokenizer reads every line
	// ending as \n.
	text := strings.TrimLeft(src, " \t")
	text = strings.ReplaceAll(strings.ReplaceAll(text, "\r\n", "\n"), "\r", "\n")
	p := &evalParser{toks: lexPy(text)}
	val, ok, err := p.parse()
	switch {
	case ok:
		return val, nil
	case err != nil:
		return nil, err
	}
	if err := p.certainError(); err != nil {
		return nil, err
	}
	return nil, &errEvalUnsupported{text: src}
}

type tokKind int

const (
	tokEnd     tokKind = iota
	tokNewline         // end of a logical line
	tokIndent          // a logical line starting further right than the first
	tokName
	tokNumber
	tokString
	tokOp      // operators and brackets
	tokUnknown // Python may take it (a non-ASCII name, an odd number): undecided
	tokError   // the tokenizer's SyntaxError; the last token but tokEnd
)

type pyToken struct {
	kind tokKind
	text string // the name, operator or number as written
	line int
	// For strings: the value (str literals this package decodes), whether
	// it is bytes, and whether its value is known (not an f-string, no
	// \N{...} escape).
	value   string
	bytes   bool
	decoded bool
	err     error // tokError's SyntaxError
}

// pyKeywords are Python 3.11's keywords; True, False and None are operands.
var pyKeywords = map[string]bool{
	"and": true, "as": true, "assert": true, "async": true, "await": true, "break": true, "class": true,
	"continue": true, "def": true, "del": true, "elif": true, "else": true, "except": true, "finally": true,
	"for": true, "from": true, "global": true, "if": true, "import": true, "in": true, "is": true,
	"lambda": true, "nonlocal": true, "not": true, "or": true, "pass": true, "raise": true, "return": true,
	"try": true, "while": true, "with": true, "yield": true,
}

// operand reports whether t is a complete operand (a name, number, string)
// and ends reports whether an operand can end with t (also a closing
// bracket): an operand right after one that ended is a SyntaxError.
func (t pyToken) operand() bool {
	return (t.kind == tokName && !pyKeywords[t.text]) || t.kind == tokNumber || t.kind == tokString
}

func (t pyToken) ends() bool {
	return t.operand() || (t.kind == tokOp && strings.Contains(")]}", t.text))
}

// cannotStart are the operators no Python expression starts with.
const cannotStart = ",:;=<>/%@&|^!"

// lexPy splits text into Python tokens, up to the first tokenizer error.
func lexPy(text string) []pyToken {
	l := &pyLexer{s: text, line: 1, lineStart: true}
	l.run()
	return l.toks
}

type pyLexer struct {
	s         string
	i         int
	line      int
	toks      []pyToken
	brackets  []byte
	lineStart bool // at the start of a physical line outside brackets
	lineHas   bool // the logical line has tokens
}

func (l *pyLexer) emit(kind tokKind, text string) {
	l.toks = append(l.toks, pyToken{kind: kind, text: text, line: l.line})
	if kind != tokNewline && kind != tokEnd {
		l.lineHas = true
	}
}

// fail ends the tokens with a SyntaxError, in CPython's words.
func (l *pyLexer) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.toks = append(l.toks,
		pyToken{kind: tokError, line: l.line, err: raise("SyntaxError", "%s (<string>, line %d)", msg, l.line)},
		pyToken{kind: tokEnd, line: l.line})
}

func (l *pyLexer) run() {
	for {
		if l.lineStart {
			if !l.indentation() {
				return
			}
			continue
		}
		if l.i >= len(l.s) {
			l.end()
			return
		}
		c := l.s[l.i]
		switch {
		case c == ' ' || c == '\t' || c == '\f':
			l.i++
		case c == '#':
			for l.i < len(l.s) && l.s[l.i] != '\n' {
				l.i++
			}
		case c == '\n':
			l.i++
			if len(l.brackets) == 0 && l.lineHas {
				l.emit(tokNewline, "")
				l.lineHas = false
			}
			l.line++
			l.lineStart = len(l.brackets) == 0
		case c == '\\':
			if !l.continuation() {
				return
			}
		case c == '\'' || c == '"':
			if !l.str("") {
				return
			}
		case isNameStart(c) || c >= 0x80:
			if !l.name() {
				return
			}
		case c >= '0' && c <= '9' || c == '.' && l.i+1 < len(l.s) && l.s[l.i+1] >= '0' && l.s[l.i+1] <= '9':
			l.number()
		case strings.IndexByte("([{", c) >= 0:
			l.brackets = append(l.brackets, c)
			l.emit(tokOp, string(c))
			l.i++
		case strings.IndexByte(")]}", c) >= 0:
			if !l.close(c) {
				return
			}
		case c == '!' && (l.i+1 >= len(l.s) || l.s[l.i+1] != '='):
			l.fail("invalid syntax")
			return
		case strings.IndexByte("+-*/%@&|^~<>=.,:;!", c) >= 0:
			l.op()
		case c < 0x20 || c == 0x7f:
			l.fail("invalid non-printable character U+%04X", c)
			return
		default: // $ ? `
			l.fail("invalid syntax")
			return
		}
	}
}

// indentation reads the start of a physical line outside brackets: a blank
// or comment line is skipped, a line starting further right than column 0
// is an INDENT (the first logical line is at column 0). A line
// continuation there continues the indentation on the next line, as in
// CPython's tokenizer, and a bad one is its error before the INDENT. It
// reports whether the tokens go on.
func (l *pyLexer) indentation() bool {
	col, j := 0, l.i
	for ; j < len(l.s) && strings.IndexByte(" \t\f\\", l.s[j]) >= 0; j++ {
		switch l.s[j] {
		case ' ':
			col++
		case '\t':
			col = (col/8 + 1) * 8
		case '\f':
			col = 0
		case '\\':
			l.i = j
			if !l.continuation() {
				return false
			}
			j = l.i - 1
		}
	}
	if j < len(l.s) && (l.s[j] == '#' || l.s[j] == '\n') {
		// A blank or comment line: its newline ends no logical line.
		for l.i = j; l.i < len(l.s) && l.s[l.i] != '\n'; l.i++ {
		}
		if l.i < len(l.s) {
			l.i++
			l.line++
		}
		l.lineStart = l.i < len(l.s)
		return true
	}
	l.i, l.lineStart = j, false
	if col > 0 {
		// Even white space at the very end is an indented line to CPython.
		l.emit(tokIndent, "")
	}
	return true
}

// continuation reads a backslash at l.i, which must end the line and be
// followed by more text.
func (l *pyLexer) continuation() bool {
	if l.i+1 >= len(l.s) || l.s[l.i+1] != '\n' {
		l.fail("unexpected character after line continuation character")
		return false
	}
	l.i += 2
	l.line++
	if l.i >= len(l.s) {
		l.fail("unexpected EOF while parsing")
		return false
	}
	return true
}

func (l *pyLexer) end() {
	if len(l.brackets) > 0 {
		l.fail("'%c' was never closed", l.brackets[len(l.brackets)-1])
		return
	}
	if l.lineHas {
		l.emit(tokNewline, "")
	}
	l.emit(tokEnd, "")
}

func (l *pyLexer) close(c byte) bool {
	open := map[byte]byte{')': '(', ']': '[', '}': '{'}[c]
	n := len(l.brackets)
	switch {
	case n == 0:
		l.fail("unmatched '%c'", c)
		return false
	case l.brackets[n-1] != open:
		l.fail("closing parenthesis '%c' does not match opening parenthesis '%c'", c, l.brackets[n-1])
		return false
	}
	l.brackets = l.brackets[:n-1]
	l.emit(tokOp, string(c))
	l.i++
	return true
}

// op reads an operator. Only its first character matters here (what an
// expression may not start with), except that "!=" is one.
func (l *pyLexer) op() {
	n := 1
	if strings.HasPrefix(l.s[l.i:], "!=") {
		n = 2
	}
	l.emit(tokOp, l.s[l.i:l.i+n])
	l.i += n
}

func isNameStart(c byte) bool { return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func isNameByte(c byte) bool { return isNameStart(c) || c >= '0' && c <= '9' }

// name reads a name, or a string's prefix and the string. A non-ASCII
// character makes the name undecided (Python's identifier rules are not
// followed here), except one that is not printable, which no name holds.
func (l *pyLexer) name() bool {
	start, ascii := l.i, true
	for l.i < len(l.s) {
		c := l.s[l.i]
		if c < 0x80 {
			if !isNameByte(c) {
				break
			}
			l.i++
			continue
		}
		r, n := pystr.DecodeRune(l.s[l.i:])
		if !pystr.IsPrintable(r) {
			if l.i == start {
				l.fail("invalid non-printable character U+%04X", r)
				return false
			}
			break
		}
		ascii = false
		l.i += n
	}
	word := l.s[start:l.i]
	if ascii && l.i < len(l.s) && (l.s[l.i] == '\'' || l.s[l.i] == '"') {
		switch strings.ToLower(word) {
		case "r", "u", "b", "br", "rb", "f", "fr", "rf":
			return l.str(word)
		}
	}
	if !ascii {
		l.emit(tokUnknown, word)
		return true
	}
	l.emit(tokName, word)
	return true
}

// number reads a number. Only the forms Python takes as one number are
// numbers here; the rest ("1if", "1_", "0b2") are undecided.
func (l *pyLexer) number() {
	start := l.i
	for l.i < len(l.s) && (isNameByte(l.s[l.i]) || l.s[l.i] == '.' ||
		(l.s[l.i] == '+' || l.s[l.i] == '-') && (l.s[l.i-1] == 'e' || l.s[l.i-1] == 'E') && !isHexPrefixed(l.s[start:l.i])) {
		l.i++
	}
	text := l.s[start:l.i]
	if isNumberLiteral(text) {
		l.emit(tokNumber, text)
		return
	}
	l.emit(tokUnknown, text)
}

func isHexPrefixed(s string) bool {
	return len(s) >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')
}

// isNumberLiteral reports whether s is one of Python's number literals.
func isNumberLiteral(s string) bool {
	digitsOf := func(s, set string) bool {
		if s == "" || s[0] == '_' || s[len(s)-1] == '_' || strings.Contains(s, "__") {
			return false
		}
		for _, c := range []byte(s) {
			if c != '_' && strings.IndexByte(set, c) < 0 {
				return false
			}
		}
		return true
	}
	const dec = "0123456789"
	if len(s) > 2 && s[0] == '0' {
		switch s[1] {
		case 'x', 'X':
			return digitsOf(strings.TrimPrefix(s[2:], "_"), dec+"abcdefABCDEF")
		case 'o', 'O':
			return digitsOf(strings.TrimPrefix(s[2:], "_"), "01234567")
		case 'b', 'B':
			return digitsOf(strings.TrimPrefix(s[2:], "_"), "01")
		}
	}
	s = strings.TrimRight(s, "jJ")
	mant, exp, hasExp := strings.Cut(strings.ToLower(s), "e")
	if hasExp && !digitsOf(strings.TrimLeft(exp, "+-"), dec) || strings.Count(exp, "+")+strings.Count(exp, "-") > 1 {
		return false
	}
	whole, frac, hasDot := strings.Cut(mant, ".")
	switch {
	case !hasDot:
		// A decimal integer may not start with 0 unless it is all zeros.
		return digitsOf(whole, dec) && (strings.Trim(whole, "0_") == "" || whole[0] != '0' || hasExp)
	case whole == "" && frac == "":
		return false
	}
	return (whole == "" || digitsOf(whole, dec)) && (frac == "" || digitsOf(frac, dec))
}

// str reads a string literal with the given prefix, the quote at l.i.
func (l *pyLexer) str(prefix string) bool {
	startLine := l.line
	q := l.s[l.i]
	triple := strings.HasPrefix(l.s[l.i:], strings.Repeat(string(q), 3))
	open := 1
	if triple {
		open = 3
	}
	l.i += open
	body := l.i
	for {
		if l.i >= len(l.s) {
			if triple {
				l.fail("unterminated triple-quoted string literal (detected at line %d)", l.line)
			} else {
				l.fail("unterminated string literal (detected at line %d)", l.line)
			}
			l.toks[len(l.toks)-2].line = startLine
			return false
		}
		c := l.s[l.i]
		switch {
		case c == '\\':
			if l.i+1 < len(l.s) && l.s[l.i+1] == '\n' {
				l.line++
			}
			l.i += 2
			continue
		case c == '\n' && !triple:
			l.fail("unterminated string literal (detected at line %d)", l.line)
			return false
		case c == '\n':
			l.line++
		case c == q && (!triple || strings.HasPrefix(l.s[l.i:], strings.Repeat(string(q), 3))):
			raw := l.s[body:l.i]
			l.i += open
			return l.strToken(prefix, raw, startLine)
		}
		l.i++
	}
}

func (l *pyLexer) strToken(prefix, raw string, line int) bool {
	p := strings.ToLower(prefix)
	t := pyToken{kind: tokString, text: prefix, line: line, bytes: strings.Contains(p, "b")}
	switch {
	case strings.ContainsAny(p, "bf"):
		// Bytes and f-strings: Python values this package does not make.
	case strings.Contains(p, "r"):
		t.value, t.decoded = raw, true
	default:
		v, known, err := unescapePy(raw)
		if err != nil {
			l.fail("(unicode error) 'unicodeescape' codec can't decode bytes in position %s", err.Error())
			return false
		}
		t.value, t.decoded = v, known
	}
	l.toks = append(l.toks, t)
	l.lineHas = true
	return true
}

// unescapePy decodes the escapes of a str literal as Python does: \ and a
// newline vanish, \\ \' \" \a \b \f \n \r \t \v, up to three octal digits,
// \xhh, \uhhhh, \Uhhhhhhhh; any other backslash stays as it is. known is
// false for a \N{name} escape (the Unicode name database is not here). An
// error says where the bad escape is, as CPython's message does.
func unescapePy(s string) (string, bool, error) {
	var b []byte
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			b = append(b, s[i])
			i++
			continue
		}
		if i+1 >= len(s) {
			b = append(b, '\\')
			break
		}
		c := s[i+1]
		switch c {
		case '\n':
		case '\\', '\'', '"':
			b = append(b, c)
		case 'a':
			b = append(b, '\a')
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'v':
			b = append(b, '\v')
		case '0', '1', '2', '3', '4', '5', '6', '7':
			r, j := rune(0), i+1
			for ; j < len(s) && j < i+4 && s[j] >= '0' && s[j] <= '7'; j++ {
				r = r*8 + rune(s[j]-'0')
			}
			b = pystr.AppendRune(b, r)
			i = j
			continue
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[c]
			r, ok := hexRune(s[i+2:], n)
			if !ok {
				end := min(i+1+n, len(s)-1)
				for j := i + 2; j < len(s) && j <= end; j++ {
					if _, isHex := hexRune(s[j:j+1], 1); !isHex {
						end = j - 1
						break
					}
				}
				return "", false, fmt.Errorf("%d-%d: truncated \\%c%s escape", i, end, c, strings.Repeat("X", n))
			}
			if r > 0x10FFFF {
				return "", false, fmt.Errorf("%d-%d: illegal Unicode character", i, i+1+n)
			}
			b = pystr.AppendRune(b, rune(r))
			i += 2 + n
			continue
		case 'N':
			if i+2 < len(s) && s[i+2] == '{' && strings.IndexByte(s[i+3:], '}') > 0 {
				return "", false, nil
			}
			return "", false, fmt.Errorf("%d-%d: malformed \\N character escape", i, i+1)
		default:
			b = append(b, '\\', c)
		}
		i += 2
	}
	return string(b), true, nil
}

// hexRune reads exactly n (at most 8) hex digits at the start of s.
func hexRune(s string, n int) (uint32, bool) {
	if len(s) < n {
		return 0, false
	}
	var r uint32
	for _, c := range []byte(s[:n]) {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | uint32(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | uint32(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | uint32(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// evalParser reads the subset: an expression that is a str (adjacent
// literals joined, in any parentheses), a list of strs, or a tuple of strs
// (in parentheses, or bare), with an optional trailing comma; then only
// the end.
type evalParser struct {
	toks []pyToken
	i    int
}

func (p *evalParser) peek() pyToken { return p.toks[p.i] }

func (p *evalParser) isOp(s string) bool {
	t := p.peek()
	return t.kind == tokOp && t.text == s
}

// parse reads the subset. When the first logical line is in it but more
// follows, err is what CPython raises (its parser meets the indent, or the
// second line, after a complete expression).
func (p *evalParser) parse() (v any, ok bool, err error) {
	v, ok = p.value()
	if !ok {
		return nil, false, nil
	}
	if p.isOp(",") {
		first, isStr := v.(string)
		if !isStr {
			return nil, false, nil
		}
		p.i++
		if v, ok = p.strItems([]any{first}, ""); !ok {
			return nil, false, nil
		}
	}
	switch p.peek().kind {
	case tokNewline:
		p.i++
	case tokEnd:
	default:
		return nil, false, nil
	}
	switch t := p.peek(); t.kind {
	case tokEnd:
		return v, true, nil
	case tokIndent:
		return nil, false, raise("IndentationError", "unexpected indent (<string>, line %d)", t.line)
	case tokError:
		return nil, false, t.err
	default:
		return nil, false, raise("SyntaxError", "invalid syntax (<string>, line %d)", t.line)
	}
}

// value reads a str, a list or a tuple at p.i.
func (p *evalParser) value() (any, bool) {
	t := p.peek()
	switch {
	case t.kind == tokString:
		return p.strs()
	case p.isOp("["):
		p.i++
		return p.strItems([]any{}, "]")
	case p.isOp("("):
		p.i++
		if p.isOp(")") {
			p.i++
			return []any{}, true
		}
		v, ok := p.value()
		if !ok {
			return nil, false
		}
		if p.isOp(")") {
			p.i++
			return v, true
		}
		first, isStr := v.(string)
		if !isStr || !p.isOp(",") {
			return nil, false
		}
		p.i++
		return p.strItems([]any{first}, ")")
	}
	return nil, false
}

// strs joins adjacent str literals.
func (p *evalParser) strs() (any, bool) {
	var b strings.Builder
	for p.peek().kind == tokString {
		t := p.peek()
		if t.bytes || !t.decoded {
			return nil, false
		}
		b.WriteString(t.value)
		p.i++
	}
	return b.String(), true
}

// strItems reads comma-separated strs up to the closing bracket (or the
// end of the line for a bare tuple), after a comma or an opening bracket.
func (p *evalParser) strItems(items []any, closing string) ([]any, bool) {
	for {
		if closing != "" && p.isOp(closing) {
			p.i++
			return items, true
		}
		if closing == "" && (p.peek().kind == tokNewline || p.peek().kind == tokEnd) {
			return items, true
		}
		v, ok := p.value()
		s, isStr := v.(string)
		if !ok || !isStr {
			return nil, false
		}
		items = append(items, s)
		switch {
		case p.isOp(","):
			p.i++
		case closing != "" && p.isOp(closing):
		case closing == "" && (p.peek().kind == tokNewline || p.peek().kind == tokEnd):
		default:
			return nil, false
		}
	}
}

// certainError is the exception CPython raises on a text outside the
// subset, when it is certain: the text is not Python. The tokens are read
// in order, as CPython's parser reads them, and the first certain error
// decides; an INDENT reached before is undecided (what precedes it might
// be Python, making it an IndentationError, or not, a SyntaxError).
func (p *evalParser) certainError() error {
	var prev pyToken
	lineStart := true
	for i, t := range p.toks {
		switch {
		case t.kind == tokError:
			return t.err
		case t.kind == tokIndent:
			if i == 0 {
				return raise("IndentationError", "unexpected indent (<string>, line %d)", t.line)
			}
			return nil
		case t.kind == tokEnd:
			if i == 0 || (i == 1 && p.toks[0].kind == tokNewline) {
				return raise("SyntaxError", "invalid syntax (<string>, line 0)")
			}
			return nil
		case t.kind == tokNewline:
			if next := p.toks[i+1]; next.kind != tokEnd && next.kind != tokIndent {
				// A second logical line, not indented.
				return raise("SyntaxError", "invalid syntax (<string>, line %d)", next.line)
			}
		case lineStart && t.kind == tokOp && strings.Contains(cannotStart, t.text[:1]),
			t.kind == tokOp && t.text == ";",
			t.kind == tokOp && t.text == "," && prev.kind == tokOp && strings.Contains("([{,", prev.text):
			return raise("SyntaxError", "invalid syntax (<string>, line %d)", t.line)
		case prev.ends() && t.operand() && !(prev.kind == tokString && t.kind == tokString):
			return raise("SyntaxError", "invalid syntax (<string>, line %d)", t.line)
		case prev.kind == tokString && t.kind == tokString && prev.bytes != t.bytes:
			return raise("SyntaxError", "cannot mix bytes and nonbytes literals (<string>, line %d)", t.line)
		}
		prev, lineStart = t, t.kind == tokNewline
	}
	return nil
}
