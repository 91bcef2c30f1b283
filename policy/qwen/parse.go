package qwen

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"legato/rl/desktop"
	"legato/rl/policy"
)

// ToolName is the name of the one function the harness declares.
const ToolName = "computer_use"

// Turn is one reply taken apart.
type Turn struct {
	// Summary is the reply's "Action:" line, or its first line of text
	// when it has none.
	Summary string
	// Thinking is the reply's reasoning: the server's reasoning field and
	// the text inside <think> in the content. Calls written there are
	// ignored.
	Thinking string
	// Calls are the reply's computer_use calls, in order.
	Calls []Call
}

// ParseReply parses a model reply into actions for screen: ParseTurn, then
// Call.Pyautogui for each call. When any call fails, the whole reply yields
// no actions and Parsed.Err says which call and why (a *ParseError).
func ParseReply(reply policy.Reply, screen Screen) policy.Parsed {
	turn, err := ParseTurn(reply)
	if err != nil {
		return policy.Parsed{Summary: turn.Summary, Err: err}
	}
	p := policy.Parsed{
		Summary: turn.Summary,
		Actions: make([]desktop.Action, 0, len(turn.Calls)),
		Calls:   make([]json.RawMessage, 0, len(turn.Calls)),
	}
	for i, c := range turn.Calls {
		a, err := c.Pyautogui(screen)
		if err == nil {
			var js []byte
			js, err = json.Marshal(c)
			p.Calls = append(p.Calls, js)
		}
		if err != nil {
			return policy.Parsed{Summary: turn.Summary, Err: &ParseError{Call: i, Action: c.Action, Err: err}}
		}
		p.Actions = append(p.Actions, a)
	}
	return p
}

// ParseTurn splits a reply into its summary, reasoning and calls. Calls come
// from reply.ToolCalls when the server parsed them, and otherwise from the
// content: <tool_call> blocks holding JSON or XML-style calls, bare
// <function=…> blocks, or, as OSWorld's agent accepts, lines holding just a
// {"name": …, "arguments": …} object. The error is a *ParseError; Summary
// and Thinking are filled in even then.
func ParseTurn(reply policy.Reply) (Turn, error) {
	content := strings.ToValidUTF8(reply.Content, "\uFFFD")
	visible, thinking := splitThinking(content)
	var t Turn
	t.Thinking = joinNonEmpty(strings.TrimSpace(strings.ToValidUTF8(reply.Reasoning, "\uFFFD")), thinking)
	blocks, text := toolCallBlocks(visible)
	t.Summary = summaryLine(text)

	if len(reply.ToolCalls) > 0 {
		// The server parsed the calls; whatever of them is left in the
		// content would be the same calls again.
		for i, tc := range reply.ToolCalls {
			c, err := openAICall(tc)
			if err != nil {
				return t, &ParseError{Call: i, Action: c.Action, Err: err}
			}
			t.Calls = append(t.Calls, c)
		}
		return t, nil
	}
	if len(blocks) == 0 {
		return t, &ParseError{Call: -1, Err: fmt.Errorf("%w: expected <tool_call>{\"name\": %q, \"arguments\": {...}}</tool_call>", ErrNoCall, ToolName)}
	}
	for i, b := range blocks {
		c, err := parseBlock(b)
		if err != nil {
			return t, &ParseError{Call: i, Action: c.Action, Err: err}
		}
		t.Calls = append(t.Calls, c)
	}
	return t, nil
}

const (
	thinkOpen     = "<think>"
	thinkClose    = "</think>"
	toolCallOpen  = "<tool_call>"
	toolCallClose = "</tool_call>"
	functionOpen  = "<function="
	functionClose = "</function>"
	paramOpen     = "<parameter="
	paramClose    = "</parameter>"
)

// splitThinking separates the text inside <think>…</think> from the rest.
// A first </think> with no <think> before it closes reasoning that the chat
// template opened in the prompt; an unterminated <think> runs to the end;
// other stray </think> tags are dropped. It runs in linear time, whatever
// the tags.
func splitThinking(s string) (visible, thinking string) {
	var vis, th []string
	if end := strings.Index(s, thinkClose); end >= 0 && !strings.Contains(s[:end], thinkOpen) {
		th = append(th, s[:end])
		s = s[end+len(thinkClose):]
	}
	for {
		open := strings.Index(s, thinkOpen)
		if open < 0 {
			vis = append(vis, strings.ReplaceAll(s, thinkClose, ""))
			break
		}
		vis = append(vis, strings.ReplaceAll(s[:open], thinkClose, ""))
		s = s[open+len(thinkOpen):]
		end := strings.Index(s, thinkClose)
		if end < 0 {
			th = append(th, s)
			break
		}
		th = append(th, s[:end])
		s = s[end+len(thinkClose):]
	}
	for i := range th {
		th[i] = strings.TrimSpace(th[i])
	}
	return strings.Join(vis, ""), joinNonEmpty(th...)
}

func joinNonEmpty(parts ...string) string {
	var keep []string
	for _, p := range parts {
		if p != "" {
			keep = append(keep, p)
		}
	}
	return strings.Join(keep, "\n")
}

// toolCallBlocks returns the bodies of the calls written in s and the text
// around them. <tool_call> blocks win; without them, <function=…> blocks;
// without those, lines that are a JSON object with a "name".
func toolCallBlocks(s string) (blocks []string, text string) {
	if blocks, text, ok := delimited(s, toolCallOpen, toolCallClose, false); ok {
		return blocks, text
	}
	if blocks, text, ok := delimited(s, functionOpen, functionClose, true); ok {
		return blocks, text
	}
	var rest []string
	for _, line := range strings.Split(s, "\n") {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "{") && strings.HasSuffix(l, "}") && strings.Contains(l, `"name"`) {
			blocks = append(blocks, l)
			continue
		}
		rest = append(rest, line)
	}
	return blocks, strings.Join(rest, "\n")
}

// delimited cuts s into the blocks between open and end tags and the text
// outside them. A block without its end tag runs to the end of s (the
// reply was cut short). keepOpen keeps the open tag in the block
// (<function=NAME> carries the name).
func delimited(s, open, end string, keepOpen bool) (blocks []string, text string, ok bool) {
	var outside []string
	for {
		i := strings.Index(s, open)
		if i < 0 {
			outside = append(outside, s)
			break
		}
		outside = append(outside, s[:i])
		prefix := ""
		if keepOpen {
			prefix = open
		}
		after := s[i+len(open):]
		stop := strings.Index(after, end)
		if stop < 0 {
			blocks = append(blocks, prefix+after)
			break
		}
		blocks = append(blocks, prefix+after[:stop])
		s = after[stop+len(end):]
	}
	return blocks, strings.Join(outside, ""), len(blocks) > 0
}

// maxSummary bounds the length of a summary, in characters.
const maxSummary = 500

// summaryLine finds the "Action:" line of text, or else its first line,
// cut to maxSummary characters.
func summaryLine(text string) string {
	return truncate(findSummary(text), maxSummary)
}

func findSummary(text string) string {
	first := ""
	for _, line := range strings.Split(text, "\n") {
		l := strings.TrimSpace(line)
		if l == "" || l == toolCallClose {
			continue
		}
		bare := strings.TrimLeft(l, "*#>-0123456789.) ")
		if len(bare) >= 7 && strings.EqualFold(bare[:7], "action:") {
			return strings.TrimSpace(strings.Trim(strings.TrimSpace(bare[7:]), "*"))
		}
		if first == "" {
			first = l
		}
	}
	return first
}

// parseBlock parses the body of one <tool_call> (or <function=…>) block.
func parseBlock(body string) (Call, error) {
	b := strings.TrimSpace(body)
	if strings.HasPrefix(b, "```") {
		// A JSON code fence inside the block.
		if nl := strings.IndexByte(b, '\n'); nl >= 0 {
			b = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(b[nl+1:]), "```"))
		}
	}
	var (
		name string
		args map[string]json.RawMessage
		err  error
	)
	switch {
	case strings.HasPrefix(b, functionOpen):
		name, args, err = parseXMLCall(b)
	case strings.HasPrefix(b, "{"):
		name, args, err = parseJSONCall(b)
	case b == "":
		err = fmt.Errorf("%w: empty tool call", ErrSyntax)
	default:
		err = fmt.Errorf("%w: a tool call holds a JSON object or <function=…>, not %q", ErrSyntax, truncate(b, 40))
	}
	if err != nil {
		return Call{}, err
	}
	if name != ToolName {
		return Call{}, fmt.Errorf("%w %q: the only function is %s", ErrUnknownFunction, truncate(name, 40), ToolName)
	}
	return decodeArgs(args)
}

// openAICall reads a call the server parsed.
func openAICall(tc policy.ToolCall) (Call, error) {
	name := strings.TrimSpace(tc.Name)
	if name != ToolName {
		return Call{}, fmt.Errorf("%w %q: the only function is %s", ErrUnknownFunction, truncate(name, 40), ToolName)
	}
	args, err := argumentsObject(json.RawMessage(strings.ToValidUTF8(tc.Arguments, "\uFFFD")))
	if err != nil {
		return Call{}, err
	}
	return decodeArgs(args)
}

// parseJSONCall reads {"name": …, "arguments": {…}}. Like json.loads in
// OSWorld's agent, it refuses anything after the object.
func parseJSONCall(b string) (string, map[string]json.RawMessage, error) {
	dec := json.NewDecoder(strings.NewReader(b))
	var call struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := dec.Decode(&call); err != nil {
		return "", nil, fmt.Errorf("%w: %v", ErrSyntax, err)
	}
	if rest := strings.TrimSpace(b[dec.InputOffset():]); rest != "" {
		return "", nil, fmt.Errorf("%w: text after the JSON object: %q", ErrSyntax, truncate(rest, 40))
	}
	if call.Name != ToolName {
		return call.Name, nil, nil
	}
	args, err := argumentsObject(call.Arguments)
	return call.Name, args, err
}

// argumentsObject decodes a call's arguments: a JSON object, or a JSON
// string holding one (OpenAI's wire form, which some models imitate).
func argumentsObject(raw json.RawMessage) (map[string]json.RawMessage, error) {
	raw = json.RawMessage(strings.TrimSpace(string(raw)))
	if len(raw) == 0 || string(raw) == "null" {
		return nil, fmt.Errorf("%w: the call has no arguments", ErrSyntax)
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("%w: arguments: %v", ErrSyntax, err)
		}
		raw = json.RawMessage(strings.TrimSpace(s))
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal(raw, &args); err != nil {
		return nil, fmt.Errorf("%w: arguments must be a JSON object: %v", ErrSyntax, err)
	}
	return args, nil
}

// parseXMLCall reads <function=NAME><parameter=KEY>VALUE</parameter>…
// </function>, the call format of Qwen3-Coder and Qwen3.5. A missing
// </parameter> or </function> is tolerated (the reply was cut short).
func parseXMLCall(b string) (string, map[string]json.RawMessage, error) {
	b = b[len(functionOpen):]
	gt := strings.IndexByte(b, '>')
	if gt < 0 {
		return "", nil, fmt.Errorf("%w: <function= without >", ErrSyntax)
	}
	name := strings.TrimSpace(b[:gt])
	body := b[gt+1:]
	if i := strings.Index(body, functionClose); i >= 0 {
		if rest := strings.TrimSpace(body[i+len(functionClose):]); rest != "" {
			return "", nil, fmt.Errorf("%w: text after </function>: %q", ErrSyntax, truncate(rest, 40))
		}
		body = body[:i]
	}
	if name != ToolName {
		return name, nil, nil
	}
	args := map[string]json.RawMessage{}
	for {
		if len(args) > maxParameters {
			// The tool has seven; bounding them also bounds the scans
			// below, which would be quadratic in a flood of unclosed tags.
			return "", nil, fmt.Errorf("%w: more than %d parameters", ErrSyntax, maxParameters)
		}
		i := strings.Index(body, paramOpen)
		if i < 0 {
			if rest := strings.TrimSpace(body); rest != "" {
				return "", nil, fmt.Errorf("%w: text outside <parameter=…>: %q", ErrSyntax, truncate(rest, 40))
			}
			break
		}
		if rest := strings.TrimSpace(body[:i]); rest != "" {
			return "", nil, fmt.Errorf("%w: text outside <parameter=…>: %q", ErrSyntax, truncate(rest, 40))
		}
		body = body[i+len(paramOpen):]
		gt := strings.IndexByte(body, '>')
		if gt < 0 {
			return "", nil, fmt.Errorf("%w: <parameter= without >", ErrSyntax)
		}
		key := strings.TrimSpace(body[:gt])
		body = body[gt+1:]
		var value string
		if end := strings.Index(body, paramClose); end >= 0 {
			value, body = body[:end], body[end+len(paramClose):]
		} else if next := strings.Index(body, paramOpen); next >= 0 {
			value, body = body[:next], body[next:]
		} else {
			value, body = body, ""
		}
		if _, dup := args[key]; dup {
			return "", nil, fmt.Errorf("%w: parameter %q given twice", ErrSyntax, truncate(key, 40))
		}
		args[key] = xmlValue(key, value)
	}
	return name, args, nil
}

// maxParameters bounds the parameters of an XML-style call.
const maxParameters = 32

// xmlValue turns an XML-style parameter into JSON. String parameters are
// taken verbatim, less the line break that the format puts after the
// opening and before the closing tag; the others are JSON when they parse
// as JSON and strings otherwise (decodeArgs reads "ctrl" or "500, 300").
func xmlValue(key, v string) json.RawMessage {
	v = strings.TrimPrefix(v, "\n")
	v = strings.TrimSuffix(v, "\n")
	switch key {
	case "action", "status":
		v = strings.TrimSpace(v)
	case "text":
	default:
		v = strings.TrimSpace(v)
		if json.Valid([]byte(v)) {
			return json.RawMessage(v)
		}
	}
	js, _ := json.Marshal(v) // a string always marshals
	return js
}

// decodeArgs reads a call's arguments into a Call, checking types. It
// accepts a few forms models write besides the declared ones: keys as one
// string, numbers and coordinates as strings. Arguments the tool does not
// declare are ignored; null is absent.
func decodeArgs(args map[string]json.RawMessage) (Call, error) {
	var c Call
	present := func(k string) (json.RawMessage, bool) {
		v, ok := args[k]
		if !ok || string(v) == "null" {
			return nil, false
		}
		return v, true
	}
	v, ok := present("action")
	if !ok {
		return c, fmt.Errorf("%w: the call has no action", ErrMissingArgument)
	}
	if err := json.Unmarshal(v, &c.Action); err != nil {
		return c, fmt.Errorf("%w: action must be a string, not %s", ErrBadArgument, truncate(string(v), 40))
	}
	c.Action = strings.TrimSpace(c.Action)
	if !knownAction(c.Action) {
		a := c.Action
		c.Action = ""
		return c, fmt.Errorf("%w %q: use one of %s", ErrUnknownAction, truncate(a, 40), strings.Join(actions(), ", "))
	}
	if v, ok := present("keys"); ok {
		var one string
		if err := json.Unmarshal(v, &c.Keys); err != nil {
			if err := json.Unmarshal(v, &one); err != nil {
				return c, fmt.Errorf("%w: keys must be a list of key names, not %s", ErrBadArgument, truncate(string(v), 40))
			}
			c.Keys = []string{one}
		}
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"text", &c.Text}, {"status", &c.Status}} {
		if v, ok := present(f.name); ok {
			if err := json.Unmarshal(v, f.dst); err != nil {
				return c, fmt.Errorf("%w: %s must be a string, not %s", ErrBadArgument, f.name, truncate(string(v), 40))
			}
		}
	}
	if v, ok := present("coordinate"); ok {
		xy, err := coordinate(v)
		if err != nil {
			return c, err
		}
		c.Coordinate = xy
	}
	for _, f := range []struct {
		name string
		dst  *float64
	}{{"pixels", &c.Pixels}, {"time", &c.Time}} {
		if v, ok := present(f.name); ok {
			n, err := number(v)
			if err != nil {
				return c, fmt.Errorf("%w: %s must be a number, not %s", ErrBadArgument, f.name, truncate(string(v), 40))
			}
			*f.dst = n
		}
	}
	return c, nil
}

// coordinate reads [x, y], also written as a string ("[500, 300]",
// "500, 300", "(500, 300)").
func coordinate(v json.RawMessage) ([]float64, error) {
	bad := fmt.Errorf("%w: coordinate must be [x, y], not %s", ErrBadArgument, truncate(string(v), 40))
	var s string
	if json.Unmarshal(v, &s) == nil {
		s = strings.TrimSpace(s)
		s = strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(s, "("), ")"))
		s = strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
		parts := strings.Split(s, ",")
		if len(parts) != 2 {
			return nil, bad
		}
		xy := make([]float64, 2)
		for i, p := range parts {
			n, err := parseFinite(strings.TrimSpace(p))
			if err != nil {
				return nil, bad
			}
			xy[i] = n
		}
		return xy, nil
	}
	var xy []float64
	if err := json.Unmarshal(v, &xy); err != nil || len(xy) != 2 {
		return nil, bad
	}
	return xy, nil
}

// number reads a JSON number or a string holding one.
func number(v json.RawMessage) (float64, error) {
	var n float64
	if err := json.Unmarshal(v, &n); err == nil {
		return n, nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return 0, err
	}
	return parseFinite(strings.TrimSpace(s))
}

// parseFinite parses a decimal number, refusing NaN, infinities and hex.
func parseFinite(s string) (float64, error) {
	if strings.ContainsAny(s, "xXpP_") {
		return 0, fmt.Errorf("not a decimal number: %q", s)
	}
	n, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(n) || math.IsInf(n, 0) {
		return 0, fmt.Errorf("not a finite number: %q", s)
	}
	return n, nil
}
