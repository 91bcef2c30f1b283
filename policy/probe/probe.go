// Package probe checks whether a model server can serve training data:
// `legato rl probe` sends a text request, an image request and the text
// request again, and reports whether logprobs, token ids, cached-token
// reporting and image input work, how long each call took, and what to
// change on the server.
package probe

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"slices"
	"text/tabwriter"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"legato/rl/policy"
	"legato/rl/schema"
)

// ErrNotTrainable means the server cannot give trainable data for a
// computer-use agent: no logprobs, no image input, or no answer at all.
var ErrNotTrainable = errors.New("policy server cannot give trainable data")

// errSkipped marks requests not sent because the text request failed.
var errSkipped = errors.New("skipped: the text request failed")

// probeMaxTokens keeps the probe's replies short when the config sets no
// limit.
const probeMaxTokens = 48

// Call is the outcome of one probe request.
type Call struct {
	// Err is the call's error; the other fields are zero when it is set.
	Err              error
	Seconds          float64
	PromptTokens     int
	CompletionTokens int
	CachedTokens     int
	CacheReported    bool
	Logprobs         int
	TokenIDs         int
	Warnings         []string
}

// Report is what a probe found.
type Report struct {
	BaseURL string
	Model   string
	// Server is who /v1/models says owns the model ("vllm", "sglang", …);
	// empty when the server did not say.
	Server string

	// Text and Image are the first two requests; Repeat is Text sent again,
	// which a prefix cache should mostly serve.
	Text, Image, Repeat Call

	// Logprobs: the text replies carried one logprob per generated token.
	Logprobs bool
	// TokenIDs is whether the server returned, ignored or refused
	// return_token_ids; Aligned that ids and logprobs had equal lengths.
	TokenIDs policy.TokenIDSupport
	Aligned  bool
	// CacheReported: the repeated request reported cached tokens;
	// CacheHit: it reported some.
	CacheReported bool
	CacheHit      bool
	// ImageInput: the image request succeeded.
	ImageInput bool

	// Trainable: the server can serve computer-use rollouts with logprobs.
	Trainable bool
	// Advice lists what to change on the server, most important first.
	Advice []string
}

// Run probes the server cfg points at. The error is nil even when the
// server is not trainable (see Report.Trainable); it is set only when the
// probe itself could not run (invalid cfg).
func Run(ctx context.Context, cfg policy.Config) (*Report, error) {
	if cfg.MaxTokens == 0 {
		cfg.MaxTokens = probeMaxTokens
	}
	if cfg.HTTPClient == nil {
		// One transport for both endpoints, closed when the probe ends.
		t := http.DefaultTransport.(*http.Transport).Clone()
		defer t.CloseIdleConnections()
		cfg.HTTPClient = &http.Client{Transport: t}
	}
	c, err := policy.New(cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	cfg = c.Config()
	r := &Report{BaseURL: cfg.BaseURL, Model: cfg.Model, Server: serverKind(ctx, cfg)}

	text := textPrompt()
	r.Text = call(ctx, c, text)
	if r.Text.Err != nil {
		// The others would fail the same way (or hang as long).
		r.Image.Err, r.Repeat.Err = errSkipped, errSkipped
	} else {
		r.Image = call(ctx, c, imagePrompt())
		r.Repeat = call(ctx, c, text)
	}
	r.TokenIDs = c.TokenIDs()
	r.assess()
	return r, nil
}

func call(ctx context.Context, c *policy.Client, msgs []schema.Message) Call {
	res, err := c.Complete(ctx, msgs)
	if err != nil {
		return Call{Err: err}
	}
	return Call{
		Seconds:          res.Model.Seconds,
		PromptTokens:     res.Model.PromptTokens,
		CompletionTokens: res.Model.CompletionTokens,
		CachedTokens:     deref(res.Model.CachedTokens),
		CacheReported:    res.CacheReported,
		Logprobs:         len(res.Response.Logprobs),
		TokenIDs:         len(res.Response.TokenIDs),
		Warnings:         res.Warnings,
	}
}

// serverKind asks /v1/models who owns the model; vLLM and SGLang name
// themselves there.
func serverKind(ctx context.Context, cfg policy.Config) string {
	opts := []option.RequestOption{option.WithBaseURL(cfg.BaseURL), option.WithMaxRetries(0), option.WithHTTPClient(cfg.HTTPClient)}
	if cfg.APIKey != "" {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.StepTimeout)
	defer cancel()
	// Not openai.NewClient: it would read OPENAI_* from the environment.
	svc := openai.NewModelService(opts...)
	page, err := svc.List(ctx)
	if err != nil {
		return ""
	}
	owners := map[string]bool{}
	for _, m := range page.Data {
		if m.ID == cfg.Model {
			return m.OwnedBy
		}
		owners[m.OwnedBy] = true
	}
	// The model may be served under an alias; a server that lists models
	// of one owner only still names itself.
	if len(owners) == 1 {
		for o := range owners {
			return o
		}
	}
	return ""
}

func (r *Report) assess() {
	texts := []Call{r.Text, r.Repeat}
	r.Logprobs = r.Text.Err == nil
	r.Aligned = true
	for _, c := range texts {
		if c.Err != nil {
			continue
		}
		if c.Logprobs == 0 || slices.Contains(c.Warnings, policy.WarnNoLogprobs) {
			r.Logprobs = false
		}
		if slices.Contains(c.Warnings, policy.WarnLogprobsMismatch) {
			r.Aligned = false
		}
	}
	r.CacheReported = r.Repeat.Err == nil && r.Repeat.CacheReported
	r.CacheHit = r.CacheReported && r.Repeat.CachedTokens > 0
	r.ImageInput = r.Image.Err == nil
	r.Trainable = r.Text.Err == nil && r.Logprobs && r.ImageInput

	add := func(s string) { r.Advice = append(r.Advice, s) }
	if r.Text.Err != nil {
		add("the text request failed (see above): check --policy-url (the OpenAI root, ending in /v1), --model and $LEGATO_POLICY_KEY")
		return
	}
	if !r.Logprobs {
		add("the server returned no logprobs, so rollouts would have nothing to train on: serve the policy with vLLM or SGLang, which return logprobs for chat completions")
	}
	if !r.ImageInput {
		add("image input failed: serve a vision-language model (on vLLM, also check --limit-mm-per-prompt allows an image)")
	}
	switch r.TokenIDs {
	case policy.TokenIDsIgnored:
		add("token ids were not returned: upgrade to a server version that supports return_token_ids (a recent vLLM or SGLang); until then the trainer must re-tokenize response_text")
	case policy.TokenIDsRefused:
		add("the server refuses return_token_ids (a hosted API?): records keep token strings instead of ids, and the trainer must re-tokenize response_text")
	}
	if !r.Aligned {
		add("token ids and logprobs differ in length; such steps are flagged logprobs_token_ids_mismatch: check the server version")
	}
	switch {
	case !r.CacheReported && r.Server == "vllm":
		add("cached tokens are not reported: start vLLM with --enable-prompt-tokens-details")
	case !r.CacheReported && r.Server == "sglang":
		add("cached tokens are not reported: start SGLang with --enable-cache-report")
	case !r.CacheReported:
		add("cached tokens are not reported: on vLLM start it with --enable-prompt-tokens-details, on SGLang with --enable-cache-report")
	case !r.CacheHit:
		add("the repeated prompt hit no cached tokens: enable prefix caching (vLLM --enable-prefix-caching; SGLang without --disable-radix-cache)")
	}
	if r.Server == "vllm" || r.Server == "" {
		add("if vLLM samples with a temperature other than 1 or with penalties, start it with --logprobs-mode processed_logprobs so logprobs match the distribution tokens were drawn from")
	}
}

// WriteTable prints r as a table, then the verdict and the advice.
func (r *Report) WriteTable(w io.Writer) error {
	var b bytes.Buffer
	server := r.Server
	if server == "" {
		server = "unknown"
	}
	fmt.Fprintf(&b, "probe %s, model %q (server: %s)\n\n", r.BaseURL, r.Model, server)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tDETAIL")
	row := func(check, result, detail string) { fmt.Fprintf(tw, "%s\t%s\t%s\n", check, result, detail) }
	row("text request", okFailed(r.Text.Err), callDetail(r.Text))
	row("image request", okFailed(r.Image.Err), callDetail(r.Image))
	row("repeat request", okFailed(r.Repeat.Err), callDetail(r.Repeat))
	if r.Text.Err == nil {
		lp := "missing"
		if r.Logprobs {
			lp = "ok"
		}
		row("logprobs", lp, fmt.Sprintf("%d for %d generated tokens", r.Text.Logprobs, r.Text.CompletionTokens))
		ids := fmt.Sprintf("%d ids", r.Text.TokenIDs)
		if r.TokenIDs == policy.TokenIDsReturned {
			if r.Aligned {
				ids += ", aligned with logprobs"
			} else {
				ids += ", NOT aligned with logprobs"
			}
		}
		row("token ids", r.TokenIDs.String(), ids)
		cache, detail := "not reported", "usage.prompt_tokens_details missing on the repeated request"
		if r.CacheReported {
			cache = "reported"
			detail = fmt.Sprintf("%d of %d prompt tokens cached on the repeated request", r.Repeat.CachedTokens, r.Repeat.PromptTokens)
		}
		row("cached tokens", cache, detail)
		row("image input", okFailed(r.Image.Err), "a 64×64 PNG as a data URL")
		row("latency", "-", fmt.Sprintf("text %s, image %s, repeat %s", seconds(r.Text), seconds(r.Image), seconds(r.Repeat)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var shown []string
	for _, c := range []struct {
		name string
		call Call
	}{{"text", r.Text}, {"image", r.Image}, {"repeat", r.Repeat}} {
		if c.call.Err != nil && !errors.Is(c.call.Err, errSkipped) && !slices.Contains(shown, c.call.Err.Error()) {
			shown = append(shown, c.call.Err.Error())
			fmt.Fprintf(&b, "\n%s request: %v\n", c.name, c.call.Err)
		}
	}
	if r.Trainable {
		b.WriteString("\nverdict: trainable\n")
	} else {
		b.WriteString("\nverdict: NOT trainable\n")
	}
	if len(r.Advice) > 0 {
		b.WriteString("\nto change on the server:\n")
		for _, a := range r.Advice {
			b.WriteString("  - " + a + "\n")
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}

func okFailed(err error) string {
	switch {
	case errors.Is(err, errSkipped):
		return "skipped"
	case err != nil:
		return "failed"
	}
	return "ok"
}

func seconds(c Call) string {
	if c.Err != nil {
		return "-"
	}
	return fmt.Sprintf("%.2f s", c.Seconds)
}

func callDetail(c Call) string {
	if errors.Is(c.Err, errSkipped) {
		return "-"
	}
	if c.Err != nil {
		var pe *policy.Error
		if errors.As(c.Err, &pe) && pe.Status != 0 {
			return fmt.Sprintf("HTTP %d", pe.Status)
		}
		return "no answer"
	}
	return fmt.Sprintf("%.2f s, %d prompt + %d completion tokens", c.Seconds, c.PromptTokens, c.CompletionTokens)
}

// textPrompt is long enough (well over one 16-token cache block) for a
// prefix cache to show hits on the repeat.
func textPrompt() []schema.Message {
	return []schema.Message{
		{Role: "system", Content: []schema.Part{schema.TextPart(
			"You are a careful assistant that operates a Linux desktop for a user. " +
				"You receive a task and screenshots, and you answer with one short action at a time. " +
				"Keep answers brief, name the element you act on, and stop when the task is done.")}},
		{Role: "user", Content: []schema.Part{schema.TextPart(
			"This is a connectivity check before a training run. Reply with one short sentence that says you are ready.")}},
	}
}

func imagePrompt() []schema.Message {
	return []schema.Message{{Role: "user", Content: []schema.Part{
		schema.TextPart("What is the main colour of this image? Answer in one word."),
		schema.ImagePart(testImage()),
	}}}
}

// testImage is a 64×64 PNG, mostly blue with a white square, as a data URL.
func testImage() string {
	img := image.NewRGBA(image.Rect(0, 0, 64, 64))
	for y := range 64 {
		for x := range 64 {
			c := color.RGBA{R: 30, G: 80, B: 200, A: 255}
			if x >= 24 && x < 40 && y >= 24 && y < 40 {
				c = color.RGBA{R: 255, G: 255, B: 255, A: 255}
			}
			img.Set(x, y, c)
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		// Encoding an in-memory RGBA image cannot fail.
		panic(err)
	}
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())
}

func deref(n *int) int {
	if n == nil {
		return 0
	}
	return *n
}
