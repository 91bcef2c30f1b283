package schema

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrDamagedLine is wrapped by ReadJSONLines' error about a line that
// does not decode and is not the last one.
var ErrDamagedLine = errors.New("damaged line")

// ReadJSONLines passes each line of an append-only JSON lines file r
// (service.jsonl, regrades.jsonl) to decode, blank lines aside, and returns
// the length of its whole lines: what the file holds up to a torn last line.
// Only the last line may be torn, what a crash mid-append leaves: a last
// line without its newline is never decoded, and one that decode refuses
// is dropped. A line before it that decode refuses is damage nobody should
// paper over: the error wraps ErrDamagedLine and names its number.
func ReadJSONLines(r io.Reader, decode func(line []byte) error) (good int64, err error) {
	br := bufio.NewReader(r)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return good, nil // a last line without its newline is a torn append
		}
		if err != nil {
			return 0, err
		}
		if len(bytes.TrimSpace(line)) > 0 {
			if err := decode(line); err != nil {
				if _, perr := br.Peek(1); errors.Is(perr, io.EOF) {
					return good, nil // the torn last line of a crash
				}
				return 0, fmt.Errorf("%w %d: %w", ErrDamagedLine, n, err)
			}
		}
		good += int64(len(line))
	}
}

// OpenJSONLines opens the JSON lines file at path (created if missing) for
// appending after its whole lines, which it reads with ReadJSONLines and
// decode, and returns their length. A torn last line is cut: an append
// after it would make it a damaged line in the middle.
func OpenJSONLines(path string, decode func(line []byte) error) (*os.File, int64, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, 0, err
	}
	good, err := ReadJSONLines(f, decode)
	if err == nil {
		err = f.Truncate(good)
	}
	if err == nil {
		_, err = f.Seek(good, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, good, nil
}
