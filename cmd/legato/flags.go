package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"legato/rl/schema"
)

// parseFlags parses a subcommand's flags. A bad flag or flag value becomes
// a usage error, which exitCode prints once with where to find the usage:
// the flag set's own report (the error, then every flag) is held back, as
// it would print the error a second time. -h prints the usage and gives
// flag.ErrHelp, which exits 0.
func parseFlags(fs *flag.FlagSet, args []string) error {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		if fs.Usage != nil {
			fs.Usage()
		} else {
			fs.PrintDefaults()
		}
		return err
	}
	return &usageError{err: err}
}

// parseInterspersed parses args with fs, letting flags come before and
// after the positional arguments (`DIR --out FILE` as well as `--out FILE
// DIR`), which the flag package alone stops at the first positional
// argument to do; everything after "--" is positional. It returns the
// positional arguments. Errors are parseFlags'.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// noArgs refuses positional arguments of a subcommand that takes none.
func noArgs(fs *flag.FlagSet) error {
	if fs.NArg() > 0 {
		return usageErrorf("unexpected arguments %q; all options are flags", fs.Args())
	}
	return nil
}

// parseRunDir parses args, flags before or after the one positional
// argument, the run directory, which it returns.
func parseRunDir(fs *flag.FlagSet, args []string) (string, error) {
	dir, rest, err := parseRunDirIDs(fs, args)
	if err == nil && len(rest) > 0 {
		err = usageErrorf("want one run directory, got %d arguments %q", len(rest)+1, append([]string{dir}, rest...))
	}
	return dir, err
}

// parseRunDirIDs parses args, flags among positional arguments: the run
// directory, then the rollout ids it returns with it.
func parseRunDirIDs(fs *flag.FlagSet, args []string) (dir string, ids []string, err error) {
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return "", nil, err
	}
	if len(pos) == 0 {
		return "", nil, usageErrorf("missing run directory: pass the run directory written by collect")
	}
	return pos[0], pos[1:], nil
}

// The bounded flag values below refuse a value out of range when the flag
// is parsed, so a bad number is a usage error that names the flag and what
// it accepts (the flag package writes `invalid value "-3" for flag -vcpus:
// want an integer from 1 to 256`) and nothing has started yet.

// intRange is an int flag limited to [min, max].
type intRange struct {
	p        *int
	min, max int
}

// intVar defines an int flag limited to [min, max]; the usage says so.
func intVar(fs *flag.FlagSet, p *int, name string, value, min, max int, usage string) {
	*p = value
	v := intRange{p: p, min: min, max: max}
	bounds := fmt.Sprintf("`n`: %d to %d", min, max)
	if max == math.MaxInt {
		bounds = fmt.Sprintf("`n` ≥ %d", min)
	}
	fs.Var(v, name, usage+" ("+bounds+")")
}

func (v intRange) accepted() string {
	if v.max == math.MaxInt {
		return fmt.Sprintf("an integer ≥ %d", v.min)
	}
	return fmt.Sprintf("an integer from %d to %d", v.min, v.max)
}

func (v intRange) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.Itoa(*v.p)
}

func (v intRange) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < v.min || n > v.max {
		return errors.New("want " + v.accepted())
	}
	*v.p = n
	return nil
}

// durationRange is a duration flag limited to [min, max] that also takes a
// plain number of seconds ("--step-timeout 60"), as collect's flags do.
type durationRange struct {
	p        *time.Duration
	min, max time.Duration
}

// durationVar defines a duration flag limited to [min, max]; the usage
// says so.
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, value, min, max time.Duration, usage string) {
	*p = value
	v := durationRange{p: p, min: min, max: max}
	fs.Var(v, name, fmt.Sprintf("%s (`duration`: %s to %s, as seconds (60) or with units (1m30s))", usage, shortDuration(min), shortDuration(max)))
}

func (v durationRange) accepted() string {
	return fmt.Sprintf("from %s to %s, as seconds (60) or a duration with units (1m30s)", shortDuration(v.min), shortDuration(v.max))
}

func (v durationRange) String() string {
	if v.p == nil {
		return "0s"
	}
	return shortDuration(*v.p)
}

// shortDuration is d without the zero units time.Duration.String writes
// ("24h", not "24h0m0s").
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func (v durationRange) Set(s string) error {
	d, err := parseSeconds(s)
	if err != nil || d < v.min || d > v.max {
		return errors.New("want " + v.accepted())
	}
	*v.p = d
	return nil
}

// parseSeconds reads a plain number of seconds ("60", "1.5") or a Go
// duration ("1m30s").
func parseSeconds(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > math.MaxInt64/float64(time.Second) {
			return 0, fmt.Errorf("%q: out of range", s)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	return time.ParseDuration(s)
}

// choice is a string flag limited to a list of values.
type choice struct {
	p       *string
	choices []string
}

// choiceVar defines a string flag that accepts only choices; the usage
// lists them.
func choiceVar(fs *flag.FlagSet, p *string, name, value string, choices []string, usage string) {
	*p = value
	fs.Var(choice{p: p, choices: choices}, name, usage+": "+orList(choices))
}

func (c choice) String() string {
	if c.p == nil {
		return ""
	}
	return *c.p
}

func (c choice) Set(s string) error {
	if !slices.Contains(c.choices, s) {
		return errors.New("want " + orList(c.choices))
	}
	*c.p = s
	return nil
}

// advantageStd is --advantage-std: "" until given, then a kind
// schema.ParseAdvantageStd accepts.
type advantageStd struct{ p *schema.AdvantageStd }

// advantageStdVar defines --advantage-std, bound to p; the usage lists the
// kinds.
func advantageStdVar(fs *flag.FlagSet, p *schema.AdvantageStd, usage string) {
	fs.Var(advantageStd{p}, "advantage-std", usage+": "+advantageStds())
}

// advantageStds lists the kinds as "population or sample".
func advantageStds() string {
	var words []string
	for _, k := range schema.AdvantageStds {
		words = append(words, string(k))
	}
	return orList(words)
}

func (a advantageStd) String() string {
	if a.p == nil {
		return ""
	}
	return string(*a.p)
}

func (a advantageStd) Set(s string) error {
	k, err := schema.ParseAdvantageStd(s)
	if err != nil {
		return errors.New("want " + advantageStds())
	}
	*a.p = k
	return nil
}

// orList joins words as "a, b or c".
func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// newFlagSet returns a subcommand's flag set: parse errors are returned,
// not exits, and they and the usage go to stderr.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// setUsage makes fs's usage text: text, then every flag under "Flags:".
func setUsage(fs *flag.FlagSet, text string) {
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), text+"Flags:\n")
		fs.PrintDefaults()
	}
}
