package policytest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Error bodies come in three shapes across servers.
type errorShape int

const (
	nestedError errorShape = iota // {"error": {"message": …}}: OpenAI, recent vLLM
	flatError                     // {"object": "error", "message": …}: SGLang, old vLLM
	stringError                   // {"error": "Unauthorized"}: vLLM's --api-key check
)

// answerError is an error answer: a status, the message and the request
// field it names, if any.
type answerError struct {
	status int
	msg    string
	param  string
}

func (s *Server) errorShape() errorShape {
	if s.opts.Dialect == SGLang {
		return flatError
	}
	return nestedError
}

// fail writes e in the dialect's shape.
func (s *Server) fail(w http.ResponseWriter, e *answerError) {
	s.writeError(w, e.status, s.errorShape(), e.msg, e.param)
}

func (s *Server) writeError(w http.ResponseWriter, status int, shape errorShape, msg, param string) {
	var p any
	if param != "" {
		p = param
	}
	typ := strings.ReplaceAll(http.StatusText(status), " ", "") + "Error"
	var code any = status
	if s.opts.Dialect == OpenAI {
		typ, code = "invalid_request_error", nil
		switch {
		case status == http.StatusUnauthorized:
			code = "invalid_api_key"
		case status == http.StatusNotFound:
			code = "model_not_found"
		case status == http.StatusTooManyRequests:
			typ, code = "requests", "rate_limit_exceeded"
		case status >= 500:
			typ = "server_error"
		}
	}
	var body any
	switch shape {
	case flatError:
		body = map[string]any{"object": "error", "message": msg, "type": typ, "param": p, "code": code}
	case stringError:
		body = map[string]any{"error": msg}
	default:
		body = map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": p, "code": code}}
	}
	writeJSON(w, status, body)
}

// refusal is the 400 of a server that does not accept fields.
func (s *Server) refusal(fields []string) *answerError {
	msg := "Unrecognized request argument supplied: " + strings.Join(fields, ", ")
	if s.opts.Dialect != OpenAI {
		msg = "unsupported field(s): " + strings.Join(fields, ", ")
	}
	return &answerError{status: http.StatusBadRequest, msg: msg, param: fields[0]}
}

// validationError is the 400 FastAPI gives vLLM and SGLang when a model
// validator of the request rejects it: the message is the validation error
// as Python prints it, which holds the whole request body as its input
// (every field name, every screenshot), and param is null.
func validationError(wr *wireRequest, why string) *answerError {
	msg := fmt.Sprintf("1 validation error:\n  {'type': 'value_error', 'loc': ('body',), 'msg': 'Value error, %s', 'input': %s, 'ctx': {'error': ValueError('%s')}}",
		why, pyDict(wr.raw), why)
	return &answerError{status: http.StatusBadRequest, msg: msg}
}

// pyDict writes JSON fields as Python prints the dict it decodes to.
func pyDict(fields map[string]json.RawMessage) string {
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		var v any
		_ = json.Unmarshal(fields[k], &v) // the body parsed already
		fmt.Fprintf(&b, "%s: %s", pyString(k), pyValue(v))
	}
	b.WriteByte('}')
	return b.String()
}

func pyValue(v any) string {
	switch v := v.(type) {
	case nil:
		return "None"
	case bool:
		if v {
			return "True"
		}
		return "False"
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case string:
		return pyString(v)
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = pyValue(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case map[string]any:
		raw := make(map[string]json.RawMessage, len(v))
		for k, e := range v {
			raw[k] = mustJSON(e)
		}
		return pyDict(raw)
	}
	return fmt.Sprint(v)
}

func pyString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, "'", `\'`, "\n", `\n`).Replace(s) + "'"
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeBody(w, status, mustJSON(v))
}

// writeBody answers with status and the JSON b.
func writeBody(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

var jsonNull = json.RawMessage("null")

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		// Only our own wire types and decoded JSON are marshalled here.
		panic(fmt.Sprintf("policytest: marshal %T: %v", v, err))
	}
	return b
}
