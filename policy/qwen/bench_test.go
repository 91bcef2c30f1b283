package qwen

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"golang.org/x/image/draw"

	"legato/rl/desktop"
	"legato/rl/policy"
)

// reportCPU reports the CPU time per op since start, as cpu-ms/op.
func reportCPU(b *testing.B, start time.Duration) {
	if end, ok := processCPU(); ok {
		b.ReportMetric(float64(end-start)/float64(b.N)/1e6, "cpu-ms/op")
	}
}

// benchScreens are 1920×1080 stand-in desktop screenshots, one per step:
// flat UI on a gradient, or on a grainy (photo-like) wallpaper.
func benchScreens(b *testing.B, n int, grain bool) [][]byte {
	b.Helper()
	shots := make([][]byte, n)
	for i := range shots {
		shots[i] = drawDesktop(b, 1920, 1080, uint64(i+1), grain)
	}
	return shots
}

// BenchmarkStep15 measures one step of the harness at step 15 of an
// attempt on a 1920×1080 screen, with the 14 earlier screenshots and replies
// in the history: Prompt (resize and encode the new screenshot, build the
// messages) plus Reply (parse, map, generate code). bytes/step is the size
// of the step's messages as JSON, what goes to the model server;
// new-bytes/step is how much of that the step added.
func BenchmarkStep15(b *testing.B) {
	for _, bc := range []struct {
		style Style
		grain bool
	}{{Qwen3VL, false}, {Qwen3VL, true}, {Qwen25VL, false}, {Qwen25VL, true}} {
		screens := map[bool]string{false: "flat", true: "photo"}[bc.grain]
		style := bc.style
		b.Run(style.String()+"/"+screens, func(b *testing.B) {
			const step = 15
			shots := benchScreens(b, step, bc.grain)
			h := New(Config{Style: style})
			ep := h.NewEpisode(goldenTask).(*Episode)
			var prev []byte
			for i := range step - 1 {
				msgs, err := ep.Prompt(desktop.Observation{Screenshot: shots[i], Width: 1920, Height: 1080})
				if err != nil {
					b.Fatal(err)
				}
				if prev, err = json.Marshal(msgs); err != nil {
					b.Fatal(err)
				}
				ep.Reply(scriptedReply(i + 1))
			}
			obs := desktop.Observation{Screenshot: shots[step-1], Width: 1920, Height: 1080}
			reply := policy.Reply{Content: "Action: Open the file menu.\n" + jsonCall(`{"action": "left_click", "coordinate": [23, 41]}`)}
			var sent int
			b.ReportAllocs()
			cpu0, _ := processCPU()
			for b.Loop() {
				e := *ep
				e.steps = slices.Clone(ep.steps)
				msgs, err := e.Prompt(obs)
				if err != nil {
					b.Fatal(err)
				}
				if p := e.Reply(reply); p.Err != nil {
					b.Fatal(p.Err)
				}
				if sent == 0 {
					js, err := json.Marshal(msgs)
					if err != nil {
						b.Fatal(err)
					}
					sent = len(js)
				}
			}
			reportCPU(b, cpu0)
			b.ReportMetric(float64(sent), "bytes/step")
			b.ReportMetric(float64(sent-len(prev)), "new-bytes/step")
		})
	}
}

// BenchmarkResize compares interpolators on the resize a 1920×1080
// screenshot gets: decode, scale, encode, base64.
func BenchmarkResize(b *testing.B) {
	shot := benchScreens(b, 1, false)[0]
	for _, style := range []Style{Qwen3VL, Qwen25VL} {
		s := Config{Style: style}.Screen(1920, 1080)
		for _, ip := range []struct {
			name   string
			interp draw.Interpolator
		}{{"ApproxBiLinear", draw.ApproxBiLinear}, {"BiLinear", draw.BiLinear}, {"CatmullRom", draw.CatmullRom}} {
			b.Run(fmt.Sprintf("%s/%dx%d/%s", style, s.ImageWidth, s.ImageHeight, ip.name), func(b *testing.B) {
				var size int
				cpu0, _ := processCPU()
				for b.Loop() {
					url, err := resize(shot, s.ImageWidth, s.ImageHeight, ip.interp)
					if err != nil {
						b.Fatal(err)
					}
					size = len(url)
				}
				reportCPU(b, cpu0)
				b.ReportMetric(float64(size), "url-bytes")
			})
		}
	}
}

// BenchmarkParseReply measures parsing a typical reply into actions.
func BenchmarkParseReply(b *testing.B) {
	reply := policy.Reply{Content: "<think>\nThe Save button is at the top right.\n</think>\n\nAction: Save the document under its new name.\n" +
		jsonCall(`{"action": "key", "keys": ["ctrl", "shift", "s"]}`) + "\n" + jsonCall(`{"action": "type", "text": "report final.docx\n"}`)}
	b.ReportAllocs()
	cpu0, _ := processCPU()
	for b.Loop() {
		if p := ParseReply(reply, screen3); p.Err != nil {
			b.Fatal(p.Err)
		}
	}
	reportCPU(b, cpu0)
}
