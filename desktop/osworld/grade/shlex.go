package grade

import (
	"errors"
	"strings"
)

// shlexSplit splits a command line like Python's shlex.split (POSIX mode,
// no comments). OSWorld's guest server splits a string command this way when
// it is not run through a shell; the native vm_command_line getter does the
// split itself so that the guest receives the same argv.
func shlexSplit(s string) ([]string, error) {
	var (
		words   []string
		cur     strings.Builder
		inWord  bool // a word has started (possibly an empty quoted one)
		quote   rune // 0, '\'' or '"'
		escaped bool
	)
	for _, r := range s {
		switch {
		case escaped:
			// Inside double quotes a backslash only escapes '"' and '\';
			// before anything else it stays.
			if quote == '"' && r != '"' && r != '\\' {
				cur.WriteByte('\\')
			}
			cur.WriteRune(r)
			escaped = false
		case quote == '\'':
			if r == '\'' {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case quote == '"':
			switch r {
			case '"':
				quote = 0
			case '\\':
				escaped = true
			default:
				cur.WriteRune(r)
			}
		case r == ' ' || r == '\t' || r == '\r' || r == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case r == '\\':
			escaped, inWord = true, true
		case r == '\'' || r == '"':
			quote, inWord = r, true
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if escaped {
		return nil, errors.New("no escaped character")
	}
	if quote != 0 {
		return nil, errors.New("no closing quotation")
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
