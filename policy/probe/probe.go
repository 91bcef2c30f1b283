// Package probe checks whether a model server can serve training data:
// `legato rl probe` sends a text request, an image request, a request with
// as many screenshots as collect keeps in a prompt (--image-max), and the
// text request again, and reports whether logprobs, exact token ids (and
// how they come), prompt token ids, cached-token reporting and image input
// work, how long each call took, and what to change on the server.
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
	"regexp"
	"slices"
	"strconv"
	"text/tabwriter"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"legato/rl/policy"
	"legato/rl/policy/qwen"
	"legato/rl/schema"
)

// ErrNotTrainable means the server cannot give trainable data for a
// computer-use agent: no logprobs, logprobs null or non-finite or not one
// per token id, no exact token ids, no image input, fewer images per prompt
// than collect sends, or no answer at all.
var ErrNotTrainable = errors.New("policy server cannot give trainable data")

// DefaultImageMax is collect's default --image-max: the most screenshots a
// prompt of the Qwen harness carries.
const DefaultImageMax = qwen.DefaultImageMax

// Options tune a probe. The zero value probes with DefaultImageMax.
type Options struct {
	// ImageMax is how many screenshots the images request sends in one
	// prompt: collect's --image-max. 0 means DefaultImageMax.
	ImageMax int
}

// Validate reports what is wrong with the options.
func (o Options) Validate() error {
	if o.ImageMax < 0 {
		return fmt.Errorf("probe: image max %d: use 1 or more (or 0 for %d)", o.ImageMax, DefaultImageMax)
	}
	return nil
}

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
	// CachedTokens is the cached-token count, when the answer gave one.
	CachedTokens   *int
	Logprobs       int
	TokenIDs       int
	PromptTokenIDs int
	Warnings       []string
}

// Report is what a probe found.
type Report struct {
	BaseURL string
	Model   string
	// Server is who /v1/models says owns the model ("vllm", "sglang", …);
	// empty when the server did not say.
	Server string

	// Text and Image (one screenshot) are the first two requests; Images
	// sends ImageMax screenshots in one prompt; Repeat is Text sent again,
	// which a prefix cache should mostly serve.
	Text, Image, Images, Repeat Call
	// ImageMax is the number of screenshots Images sent.
	ImageMax int

	// Logprobs: the text replies carried one logprob per generated token.
	Logprobs bool
	// NonFiniteLogprobs: some reply's logprobs came null (a server's NaN),
	// NaN or infinite.
	NonFiniteLogprobs bool
	// TokenIDs is how the server gives generated token ids (see
	// policy.Client.TokenIDSource); "" when no answer came.
	TokenIDs schema.TokenIDSource
	// Exact: the ids are the generated ones; Aligned: ids and logprobs had
	// equal lengths in every reply; PromptTokenIDs: the server returned
	// the prompt's ids.
	Exact          bool
	Aligned        bool
	PromptTokenIDs bool
	// Refused lists the token-id fields the server refused with a 400.
	Refused []string
	// CacheReported: the repeated request gave a cached-token count;
	// CacheHit: a count above 0.
	CacheReported bool
	CacheHit      bool
	// ImageInput: the image request succeeded. ImagesAccepted: the server
	// took ImageMax screenshots in one prompt; when it refused them for its
	// limit, ImageLimit is that limit (vLLM's --limit-mm-per-prompt).
	ImageInput     bool
	ImagesAccepted bool
	ImageLimit     int

	// Trainable: the server can serve computer-use rollouts with exact
	// token ids and logprobs; Why says what stops it, when it cannot.
	Trainable bool
	Why       []string
	// Advice lists what to change on the server, most important first.
	Advice []string
}

// Run probes the server cfg points at. The error is nil even when the
// server is not trainable (see Report.Trainable); it is set only when the
// probe itself could not run (invalid cfg or opts).
func Run(ctx context.Context, cfg policy.Config, opts Options) (*Report, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.ImageMax == 0 {
		opts.ImageMax = DefaultImageMax
	}
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
	r := &Report{BaseURL: cfg.BaseURL, Model: cfg.Model, Server: serverKind(ctx, cfg), ImageMax: opts.ImageMax}

	text := textPrompt()
	r.Text = call(ctx, c, text)
	switch {
	case r.Text.Err != nil:
		// The others would fail the same way (or hang as long).
		r.Image.Err, r.Images.Err, r.Repeat.Err = errSkipped, errSkipped, errSkipped
	default:
		r.Image = call(ctx, c, imagePrompt(1))
		if r.Image.Err == nil {
			r.Images = call(ctx, c, imagePrompt(opts.ImageMax))
		} else {
			r.Images.Err = errNoImages
		}
		r.Repeat = call(ctx, c, text)
	}
	r.TokenIDs = c.TokenIDSource()
	r.Refused = c.RefusedFields()
	r.assess()
	return r, nil
}

// errNoImages marks the images request not sent because one image failed.
var errNoImages = errors.New("skipped: the one-image request failed")

func call(ctx context.Context, c *policy.Client, msgs []schema.Message) Call {
	res, err := c.Complete(ctx, msgs)
	if err != nil {
		return Call{Err: err}
	}
	return Call{
		Seconds:          res.Model.Seconds,
		PromptTokens:     res.Model.PromptTokens,
		CompletionTokens: res.Model.CompletionTokens,
		CachedTokens:     res.Model.CachedTokens,
		Logprobs:         len(res.Response.Logprobs),
		TokenIDs:         len(res.Response.TokenIDs),
		PromptTokenIDs:   len(res.PromptTokenIDs),
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

// imageLimit reads vLLM's refusal of a prompt over --limit-mm-per-prompt:
// "At most N image(s) may be provided in one prompt." (before mid-2026,
// "in one request").
var imageLimit = regexp.MustCompile(`At most (\d+) image\(s\) may be provided in one (?:prompt|request)`)

func (r *Report) assess() {
	texts := []Call{r.Text, r.Repeat}
	r.Logprobs = r.Text.Err == nil
	for _, c := range texts {
		if c.Err != nil || slices.Contains(c.Warnings, policy.WarnNonFiniteLogprobs) {
			continue // broken, not missing: see below
		}
		if c.Logprobs == 0 || slices.Contains(c.Warnings, policy.WarnNoLogprobs) {
			r.Logprobs = false
		}
	}
	// Any reply shows a broken logprob, images ones too: collect would
	// record the same.
	r.Aligned = true
	for _, c := range []Call{r.Text, r.Image, r.Images, r.Repeat} {
		if c.Err != nil {
			continue
		}
		if slices.Contains(c.Warnings, policy.WarnNonFiniteLogprobs) {
			r.NonFiniteLogprobs = true
		}
		if slices.Contains(c.Warnings, policy.WarnLogprobsMismatch) {
			r.Aligned = false
		}
	}
	for _, c := range []Call{r.Text, r.Image, r.Images, r.Repeat} {
		if c.Err == nil && c.PromptTokenIDs > 0 {
			r.PromptTokenIDs = true
		}
	}
	r.Exact = r.TokenIDs.Exact()
	r.CacheReported = r.Repeat.Err == nil && r.Repeat.CachedTokens != nil
	r.CacheHit = r.CacheReported && *r.Repeat.CachedTokens > 0
	r.ImageInput = r.Image.Err == nil
	r.ImagesAccepted = r.Images.Err == nil
	var pe *policy.Error
	if errors.As(r.Images.Err, &pe) && pe.Status == http.StatusBadRequest {
		if m := imageLimit.FindStringSubmatch(pe.Message); m != nil {
			r.ImageLimit, _ = strconv.Atoi(m[1])
		}
	}

	why := func(s string) { r.Why = append(r.Why, s) }
	add := func(s string) { r.Advice = append(r.Advice, s) }
	var sid *policy.StringIDsError
	if errors.As(r.Text.Err, &sid) {
		// A format, not an outage: the engine generated.
		why(fmt.Sprintf("token ids as strings in %s", sid.Field))
		add(stringIDsAdvice(sid))
		return
	}
	if r.Text.Err != nil {
		r.Trainable = false
		if policy.IsOutage(r.Text.Err) {
			// Listing the model proves nothing: an engine whose worker
			// died behind a live HTTP front, or a gateway with no
			// backend, still lists it.
			why("the server does not serve a generation")
			add("the text request failed the way a broken server fails (5xx, a dropped or unparsable answer, a timeout), whatever GET /models says: check the server's logs (a dead engine worker, CUDA out of memory) and the gateway in front of it")
			return
		}
		why("the text request failed")
		add("the text request failed (see above): check --policy-url (the OpenAI root, ending in /v1), --model and $LEGATO_POLICY_KEY")
		return
	}
	if !r.Logprobs {
		why("no logprobs")
		add("the server returned no logprobs, so rollouts would have nothing to train on: serve the policy with vLLM or SGLang, which return logprobs for chat completions")
	}
	if r.NonFiniteLogprobs {
		why("null or non-finite logprobs")
		add("the server sent logprobs as null (how vLLM and SGLang send NaN), NaN or infinite, which no trainer can use: collect marks such steps " +
			policy.WarnNonFiniteLogprobs + " and export refuses them; check the model's dtype and weights, and the server version")
	}
	if r.Exact && !r.Aligned {
		why("logprobs not aligned with token ids")
		add("token ids and logprobs differ in length, so no logprob can be matched to its token: collect marks such steps " +
			policy.WarnLogprobsMismatch + " and export refuses them; check the server version")
	}
	if !r.Exact {
		why("not exact: token strings, no token ids")
		add(r.upgradeAdvice())
	}
	if !r.ImageInput {
		why("no image input")
		add("image input failed: serve a vision-language model (on vLLM, also check --limit-mm-per-prompt allows an image)")
	}
	switch {
	case r.ImageInput && !r.ImagesAccepted && r.ImageLimit > 0:
		why(fmt.Sprintf("at most %d images per prompt, and --image-max is %d", r.ImageLimit, r.ImageMax))
		add(fmt.Sprintf("the server refuses more than %d image(s) in one prompt and collect sends up to --image-max %d: start vLLM with --limit-mm-per-prompt '{\"image\": %d}', or collect (and probe) with --image-max %d",
			r.ImageLimit, r.ImageMax, r.ImageMax, r.ImageLimit))
	case r.ImageInput && !r.ImagesAccepted:
		why(fmt.Sprintf("%d images in one prompt failed", r.ImageMax))
		add(fmt.Sprintf("a prompt of %d screenshots (--image-max) failed (see above): check the server's per-prompt image limit and context length, or lower --image-max", r.ImageMax))
	}
	switch r.TokenIDs {
	case schema.SourceTokensAsIDs:
		add("token ids are exact through vLLM's return_tokens_as_token_ids, but this vLLM returns no prompt token ids: upgrade to vLLM 0.10.2 or later (return_token_ids) to record them")
	case schema.SourceMetaInfo:
		add("token ids are exact through SGLang's return_meta_info; an SGLang whose chat endpoint has return_token_ids (mid-2026) returns them directly")
	}
	switch {
	case r.Repeat.Err != nil:
		add("the repeated request failed (see above), so cached-token reporting and prefix caching were not checked: probe again once the server answers every request")
	case !r.CacheReported && r.Server == "vllm":
		add("no cached-token count on the repeated request: start vLLM with --enable-prompt-tokens-details (vLLM before mid-2026 also leaves the count out when nothing was cached: check --enable-prefix-caching too)")
	case !r.CacheReported && r.Server == "sglang":
		add("no cached-token count on the repeated request: start SGLang with --enable-cache-report (and without --disable-radix-cache)")
	case !r.CacheReported:
		add("no cached-token count on the repeated request: on vLLM start it with --enable-prompt-tokens-details, on SGLang with --enable-cache-report")
	case !r.CacheHit:
		add("the repeated prompt hit no cached tokens: enable prefix caching (vLLM --enable-prefix-caching; SGLang without --disable-radix-cache)")
	}
	if r.Server == "vllm" || r.Server == "" {
		add("if vLLM samples with a temperature other than 1 or with penalties, start it with --logprobs-mode processed_logprobs so logprobs match the distribution tokens were drawn from")
	}
	r.Trainable = len(r.Why) == 0
}

// stringIDsAdvice says what to change on a server that sends token ids
// as strings.
func stringIDsAdvice(sid *policy.StringIDsError) string {
	return fmt.Sprintf("the server sends %s as strings (%s) where legato reads token ids as JSON integers, as vLLM 0.10.2+ (return_token_ids) and SGLang (return_token_ids, return_meta_info) send them: "+
		"serve the policy with one of them, or, if a proxy or gateway stands between, point --policy-url at the engine itself or have the proxy pass the ids through as numbers", sid.Field, sid.Value)
}

// upgradeAdvice says what gives exact token ids, for a server that gave
// none in any form the client knows.
func (r *Report) upgradeAdvice() string {
	switch {
	case len(r.Refused) > 0:
		return fmt.Sprintf("not exact: the server refuses %s (a hosted API?), so records keep token strings, which a trainer must re-tokenize: serve the policy with vLLM 0.10.2+ or an SGLang with return_token_ids",
			joinFields(r.Refused))
	case r.Server == "vllm":
		return "not exact: this vLLM returns token strings even with return_tokens_as_token_ids: upgrade vLLM to 0.10.2 or later (return_token_ids)"
	case r.Server == "sglang":
		return "not exact: this SGLang returns token strings only: upgrade SGLang to 0.5.13 or later (return_meta_info), or a release whose chat endpoint has return_token_ids (mid-2026)"
	}
	return "not exact: the server returns token strings, not ids, with return_token_ids, return_tokens_as_token_ids and return_meta_info: serve the policy with vLLM 0.10.2+ or an SGLang with return_token_ids"
}

func joinFields(fields []string) string {
	switch len(fields) {
	case 0:
		return ""
	case 1:
		return fields[0]
	}
	out := fields[0]
	for _, f := range fields[1 : len(fields)-1] {
		out += ", " + f
	}
	return out + " and " + fields[len(fields)-1]
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
	row("images request", okFailed(r.Images.Err), callDetail(r.Images))
	row("repeat request", okFailed(r.Repeat.Err), callDetail(r.Repeat))
	if r.Text.Err == nil {
		lp, detail := "missing", fmt.Sprintf("%d for %d generated tokens", r.Text.Logprobs, r.Text.CompletionTokens)
		switch {
		case r.NonFiniteLogprobs:
			lp, detail = "NOT finite", "null, NaN or infinite logprobs"
		case r.Logprobs:
			lp = "ok"
		}
		row("logprobs", lp, detail)
		ids, detail := "exact", fmt.Sprintf("%d ids from %s", r.Text.TokenIDs, r.TokenIDs)
		switch {
		case !r.Exact:
			ids, detail = "NOT exact", "token strings only"
		case r.Aligned:
			detail += ", aligned with logprobs"
		default:
			detail += ", NOT aligned with logprobs"
		}
		row("token ids", ids, detail)
		prompt, detail := "missing", "the server returned no prompt token ids"
		if r.PromptTokenIDs {
			prompt, detail = "ok", fmt.Sprintf("%d for %d prompt tokens", r.Text.PromptTokenIDs, r.Text.PromptTokens)
		}
		row("prompt token ids", prompt, detail)
		cache, detail := "not reported", "no cached-token count on the repeated request"
		switch {
		case r.Repeat.Err != nil:
			cache, detail = "unknown", "the repeated request failed"
		case r.CacheReported:
			cache = "reported"
			detail = fmt.Sprintf("%d of %d prompt tokens cached on the repeated request", *r.Repeat.CachedTokens, r.Repeat.PromptTokens)
		}
		row("cached tokens", cache, detail)
		row("image input", okFailed(r.Image.Err), "a 64×64 PNG as a data URL")
		images := fmt.Sprintf("%d screenshots in one prompt (--image-max)", r.ImageMax)
		if r.ImageLimit > 0 {
			images += fmt.Sprintf("; the server allows %d", r.ImageLimit)
		}
		row("images per prompt", okFailed(r.Images.Err), images)
		row("latency", "-", fmt.Sprintf("text %s, image %s, images %s, repeat %s", seconds(r.Text), seconds(r.Image), seconds(r.Images), seconds(r.Repeat)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var shown []string
	for _, c := range []struct {
		name string
		call Call
	}{{"text", r.Text}, {"image", r.Image}, {"images", r.Images}, {"repeat", r.Repeat}} {
		if c.call.Err != nil && !skipped(c.call.Err) && !slices.Contains(shown, c.call.Err.Error()) {
			shown = append(shown, c.call.Err.Error())
			fmt.Fprintf(&b, "\n%s request: %v\n", c.name, c.call.Err)
		}
	}
	if r.Trainable {
		fmt.Fprintf(&b, "\nverdict: trainable (token ids exact, from %s)\n", r.TokenIDs)
	} else {
		fmt.Fprintf(&b, "\nverdict: NOT trainable: %s\n", joinFields(r.Why))
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

func skipped(err error) bool { return errors.Is(err, errSkipped) || errors.Is(err, errNoImages) }

func okFailed(err error) string {
	switch {
	case skipped(err):
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
	if skipped(c.Err) {
		return "-"
	}
	if c.Err != nil {
		var pe *policy.Error
		if errors.As(c.Err, &pe) && pe.Status != 0 {
			return fmt.Sprintf("HTTP %d", pe.Status)
		}
		if errors.As(c.Err, new(*policy.StringIDsError)) {
			return "answered, with token ids as strings"
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

// imagePrompt asks about n screenshots in one prompt, each a different
// image, as collect's prompts hold.
func imagePrompt(n int) []schema.Message {
	parts := []schema.Part{schema.TextPart("What is the main colour of these images? Answer in one word.")}
	for i := range n {
		parts = append(parts, schema.ImagePart(testImage(i)))
	}
	return []schema.Message{{Role: "user", Content: parts}}
}

// testImage is a 64×64 PNG, mostly blue with a white square placed by i,
// as a data URL.
func testImage(i int) string {
	img := image.NewRGBA(image.Rect(0, 0, 64, 64))
	ox, oy := 8+(i*5)%40, 8+(i*11)%40
	for y := range 64 {
		for x := range 64 {
			c := color.RGBA{R: 30, G: 80, B: 200, A: 255}
			if x >= ox && x < ox+16 && y >= oy && y < oy+16 {
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
