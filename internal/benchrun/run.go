// Package benchrun writes large synthetic run directories and measures
// what the export and commit benchmarks report (CPU time, disk use, the
// time to copy a file), for the Go benchmarks and `legato rl bench` alike.
package benchrun

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"

	"legato/rl/schema"
)

// Run describes a synthetic run: Rollouts attempts of Steps steps each,
// in groups of Group, shaped like a real batch's run directory.
type Run struct {
	Rollouts, Steps, Group int
	// PromptIDs stores each step's prompt token ids (2,000 + 300 per
	// step), chunked as a schema.TokenWriter stores them.
	PromptIDs bool
	// Loose stores each message and token chunk as a file of its own, as
	// runs did before packs.
	Loose bool
}

// benchPack appends objects to a pack file as schema documents the
// layout: a magic, then per object its content's sha256, the length of
// its data and the data.
type benchPack struct {
	mu sync.Mutex
	w  *bufio.Writer
	f  *os.File
}

func newBenchPack(dir string) (*benchPack, error) {
	f, err := os.Create(filepath.Join(dir, "pack-1"))
	if err != nil {
		return nil, err
	}
	p := &benchPack{f: f, w: bufio.NewWriterSize(f, 1<<20)}
	_, err = p.w.WriteString("LGPACK1\n")
	return p, err
}

func (p *benchPack) put(sum [32]byte, data []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.w.Write(sum[:])
	p.w.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(data))))
	_, err := p.w.Write(data)
	return err
}

func (p *benchPack) close() error {
	err := p.w.Flush()
	if cerr := p.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// store writes one object of the kind in dir: into its pack, or as a file
// named by its hash.
func (s Run) store(pack *benchPack, dir string, sum [32]byte, data []byte) error {
	if s.Loose {
		return os.WriteFile(filepath.Join(dir, hex.EncodeToString(sum[:])), data, 0o644)
	}
	return pack.put(sum, data)
}

// Write writes the run into dir the way the content store lays it out,
// without a Run: a Run syncs every object and record, which would make
// generating 300,000 messages take minutes. Like a real run, each step's
// prompt repeats the rollout's history (system prompt, instruction, every
// earlier reply and screenshot), so messages are shared across steps and
// each rollout adds two new ones per step. Each screenshot is a small PNG
// of its own in images/ (an export reads its header for the samples'
// image sizes; the pixels, never read, need not be a screen's).
func (s Run) Write(dir string) error {
	for _, d := range []string{schema.MessagesDir, schema.ImagesDir, schema.TokensDir} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		return err
	}
	defer enc.Close()
	msgDir, tokDir := filepath.Join(dir, schema.MessagesDir), filepath.Join(dir, schema.TokensDir)
	var msgPack, tokPack *benchPack
	if !s.Loose {
		if msgPack, err = newBenchPack(msgDir); err != nil {
			return err
		}
		if tokPack, err = newBenchPack(tokDir); err != nil {
			return err
		}
	}
	put := func(m schema.Message) (string, error) {
		canon, err := json.Marshal(m)
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256(canon)
		return hex.EncodeToString(sum[:]), s.store(msgPack, msgDir, sum, enc.EncodeAll(canon, nil))
	}
	// putIDs stores a rollout's next prompt as schema.Run's TokenWriter
	// does: cut by the rollout's chunker, each new chunk zstd-compressed
	// under its hash. A chunk already written (a sibling's) is not
	// written again.
	var stored sync.Map
	putIDs := func(c *schema.PromptChunker, ids []int64) ([]string, error) {
		var hashes []string
		for _, ch := range c.Cut(ids) {
			hashes = append(hashes, ch.Hash)
			if ch.Content == nil {
				continue
			}
			if _, dup := stored.LoadOrStore(ch.Hash, struct{}{}); dup {
				continue
			}
			sum, _ := hex.DecodeString(ch.Hash)
			if err := s.store(tokPack, tokDir, [32]byte(sum), enc.EncodeAll(ch.Content, nil)); err != nil {
				return nil, err
			}
		}
		return hashes, nil
	}
	// A system prompt the size of a computer_use tool schema.
	system, err := put(schema.Message{Role: "system", Content: []schema.Part{
		schema.TextPart(strings.Repeat("You control a desktop through the computer_use tool; describe each action. ", 40)),
	}})
	if err != nil {
		return err
	}

	f, err := os.Create(filepath.Join(dir, schema.RecordsFile))
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	start := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

	// Rollouts are built by two workers (the machine has two cores) and
	// written in order.
	recs := make([][]byte, s.Rollouts)
	var g errgroup.Group
	g.SetLimit(2)
	instructions := make([]string, (s.Rollouts+s.Group-1)/s.Group)
	var instrMu sync.Mutex
	for i := range s.Rollouts {
		g.Go(func() error {
			task := i / s.Group
			instrMu.Lock()
			instr := instructions[task]
			if instr == "" {
				if instr, err = put(schema.Message{Role: "user", Content: []schema.Part{
					schema.TextPart(fmt.Sprintf("Task %d: open the report in the spreadsheet and sum column B, then save it as a PDF.", task)),
				}}); err != nil {
					instrMu.Unlock()
					return err
				}
				instructions[task] = instr
			}
			instrMu.Unlock()
			rec := schema.Record{
				Schema: schema.Version, RolloutID: fmt.Sprintf("r-%05d", i), TaskID: fmt.Sprintf("task-%04d", task),
				Domain: "libreoffice_calc", GroupID: fmt.Sprintf("v1/task-%04d", task), Attempt: i % s.Group,
				Policy: schema.Policy{Model: "qwen3-vl-8b", Version: "v1"}, Status: schema.StatusOK,
				Reward: new(float64), NSteps: s.Steps, Desktop: i % 16,
				StartedAt: schema.Time{Time: start.Add(time.Duration(i) * time.Second)},
				EndedAt:   schema.Time{Time: start.Add(time.Duration(i)*time.Second + 90*time.Second)},
			}
			*rec.Reward = float64(i % 3 % 2)
			history := []string{system, instr}
			var chunker schema.PromptChunker
			// The prompt's ids: 2,000 to start, then each step's reply
			// (80 ids) and 220 more, so that it grows by 300 a step and
			// holds every earlier reply as contiguous history does.
			var prompt []int64
			grow := func(n int) {
				for range n {
					prompt = append(prompt, int64(100+(i*31+len(prompt)*17)%150000))
				}
			}
			grow(2000)
			for k := range s.Steps {
				img, err := putImage(dir, i*1000+k)
				if err != nil {
					return err
				}
				shot, err := put(schema.Message{Role: "user", Content: []schema.Part{
					schema.ImagePart(schema.ImageScheme + img),
				}})
				if err != nil {
					return err
				}
				history = append(history, shot)
				content := fmt.Sprintf("I will click cell B%d to select it.\n<tool_call>{\"name\": \"computer_use\", \"arguments\": {\"action\": \"left_click\", \"coordinate\": [%d, %d]}}</tool_call>", k+2, 100+k, 200+i%500)
				ids := make([]int64, 80)
				lps := make([]float64, 80)
				for j := range ids {
					ids[j] = int64(1000 + (i*7+j*13)%150000)
					lps[j] = -float64((i+j)%97) / 64
				}
				var chunks []string
				var count int
				if s.PromptIDs {
					if chunks, err = putIDs(&chunker, prompt); err != nil {
						return err
					}
					count = len(prompt)
				}
				prompt = append(prompt, ids...)
				grow(220)
				rec.Steps = append(rec.Steps, schema.Step{
					Request:           append([]string(nil), history...),
					PromptTokenChunks: chunks,
					PromptTokenCount:  count,
					StartedAt:         rec.StartedAt,
					Response: schema.Response{Content: content, Reasoning: "The spreadsheet is open; column B holds the values.",
						TokenIDs: ids, Logprobs: lps, FinishReason: "stop", TokenIDsSource: schema.SourceReturnTokenIDs},
					Model:   schema.ModelCall{Seconds: 1.5, Attempts: 1, PromptTokens: 2000 + 1200*k, CompletionTokens: 80, CachedTokens: new(1200 * k)},
					Actions: []schema.ActionRecord{{Action: fmt.Sprintf("import pyautogui; pyautogui.click(%d, %d)", 100+k, 200), ActS: 0.2, WaitS: 1, ObsS: 0.3}},
				})
				reply, err := put(schema.Message{Role: "assistant", Content: []schema.Part{schema.TextPart(content)}})
				if err != nil {
					return err
				}
				history = append(history, reply)
			}
			line, err := json.Marshal(&rec)
			recs[i] = append(line, '\n')
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if !s.Loose {
		if err := msgPack.close(); err != nil {
			return err
		}
		if err := tokPack.close(); err != nil {
			return err
		}
	}
	for _, line := range recs {
		if _, err := w.Write(line); err != nil {
			return err
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// putImage writes a 16×9 grey PNG whose first pixels spell n, as the
// store names images (images/<sha256>.png), and returns its hash.
func putImage(dir string, n int) (string, error) {
	img := image.NewGray(image.Rect(0, 0, 16, 9))
	binary.LittleEndian.PutUint64(img.Pix, uint64(n))
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		return "", err
	}
	sum := sha256.Sum256(b.Bytes())
	h := hex.EncodeToString(sum[:])
	return h, os.WriteFile(filepath.Join(dir, schema.ImagesDir, h+".png"), b.Bytes(), 0o644)
}
