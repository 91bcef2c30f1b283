package rl_test

import (
	"bytes"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rl "legato/rl"
	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
)

// ExampleCollect is the README's "From Go" code, as it is there:
// TestREADMEFromGo keeps the two the same.
func ExampleCollect() {
	ctx := context.Background()
	// The scripted model server and in-memory desktops stand in for vLLM or
	// SGLang and OSWorld VMs (an osworld.NewPool's New), so this runs anywhere.
	srv, err := policytest.Listen("127.0.0.1:0", policytest.Options{NoLatency: true})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	newDesktop := fake.Factory(fake.Config{Seed: 7, DefaultReward: fake.Reward{P: 0.5}, ReadyWaiter: true})
	out, err := os.MkdirTemp("", "legato-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(out)

	tasks, err := rl.LoadTasks("examples/fake-tasks.json", rl.LoadOptions{})
	if err != nil {
		log.Fatal(err)
	}
	pol := rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "step-41",
		APIKey: os.Getenv("LEGATO_POLICY_KEY"), MaxInflight: 32}
	tokens := 0
	sum, err := rl.Collect(ctx, tasks, pol, rl.CollectOptions{
		Out: filepath.Join(out, "step-41"), NewDesktop: newDesktop, Desktops: 4, Group: 4, Oversample: 0.25,
		OnGroup: func(g rl.Group) {
			for i := range g.Finished {
				for _, step := range g.Finished[i].Steps {
					// A token's policy-gradient term: g.Advantages[i] × the
					// gradient of its logprob, step.Response.Logprobs[k].
					tokens += len(step.Response.Logprobs)
				}
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d of %d groups closed, %d tokens to train on\n", sum.GroupsClosed, sum.Groups, tokens)
	// Output: 6 of 6 groups closed, 5676 tokens to train on
}

// TestREADMEFromGo checks that the README's "From Go" code block is the
// body of ExampleCollect, which compiles and runs: the README shows code
// that works as written.
func TestREADMEFromGo(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := bytes.Cut(readme, []byte("\n## From Go\n"))
	if !ok {
		t.Fatal(`README.md has no "## From Go" section`)
	}
	_, block, ok := bytes.Cut(section, []byte("\n```go\n"))
	if !ok {
		t.Fatal(`the "From Go" section has no go code block`)
	}
	block, _, ok = bytes.Cut(block, []byte("\n```\n"))
	if !ok {
		t.Fatal(`the "From Go" code block does not end`)
	}

	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "example_test.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var body *ast.BlockStmt
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "ExampleCollect" {
			body = fn.Body
		}
	}
	if body == nil {
		t.Fatal("example_test.go has no ExampleCollect")
	}
	code := string(src[fset.Position(body.Lbrace).Offset+1 : fset.Position(body.Rbrace).Offset])
	code, _, _ = strings.Cut(code, "\t// Output:")
	var lines []string
	for _, l := range strings.Split(strings.Trim(code, "\n"), "\n") {
		lines = append(lines, strings.TrimPrefix(l, "\t"))
	}
	if want := strings.Join(lines, "\n"); string(block) != want {
		t.Errorf("README.md's \"From Go\" block is not ExampleCollect's code; make it:\n%s", want)
	}
}
