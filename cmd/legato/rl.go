package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// command is one `legato rl` subcommand.
type command struct {
	name string
	// summary is the line shown in the list of subcommands.
	summary string
	// run runs the subcommand with the arguments after its name. Its
	// errors are prefixed with "legato rl <name>: " by the dispatcher.
	run func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands returns the table of subcommands, in the order help lists them.
// A function rather than a package variable: help reads the table it is
// part of, and each call gets fresh commands (each is a small type whose
// fields the flags bind to, used for one run).
func commands() []command {
	return []command{
		{"probe", "check that a model server returns logprobs, token ids and cached tokens", new(probeCommand).Run},
		{"collect", "run a batch of tasks on a pool of desktops and grade every attempt", runCollect},
		{"serve", "serve rollouts to a trainer over HTTP: groups submitted while it trains, a resumable stream, pause and version switches", runServe},
		{"grader", "say, before a batch, which Python grades and which metrics and tasks can be graded", runGrader},
		{"tasks", "check tasks before a batch (tasks check): setup and grader twice on fresh states; say which to quarantine", runTasks},
		{"replay", "run recorded attempts again without a model: same start state, same actions; compare every screen and the reward", runReplay},
		{"regrade", "grade the end states collect --keep-end-states kept again, with the tasks as they are now, beside the recorded rewards", runRegrade},
		{"export", "write a run's training samples, with GRPO group advantages", new(exportCommand).Run},
		{"repair", "move a run's damaged lines and duplicate final records to a quarantine file", new(repairCommand).Run},
		{"profile", "show where a batch spent its time (phases, latency, timelines)", new(profileCommand).Run},
		{"view", "browse a run's attempts step by step (screenshots with the actions drawn on them) on a local web page, or write it as files", new(viewCommand).Run},
		{"hosts", "list the libvirt hosts (answers? cap, image held?); hosts sync uploads the image to them", new(hostsCommand).Run},
		{"host-agent", "run on a libvirt host for a fleet on another machine (started over SSH): fork golden states there", new(hostAgentCommand).Run},
		{"gc", "remove the VMs and their volumes a crashed batch left behind on each host", new(gcCommand).Run},
		{"bench", "measure export speed beside copying the same bytes, and how long finished attempts wait for their commit", new(benchCommand).Run},
		{"serve-policy", "serve a scripted OpenAI-compatible model on loopback (no GPU)", new(servePolicyCommand).Run},
		{"help", "show this help, or the help of one subcommand", runHelp},
	}
}

func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// runRL dispatches `legato rl <subcommand> [flags]`.
func runRL(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		writeHelp(stderr)
		return usageErrorf("legato rl: missing subcommand")
	}
	name := args[0]
	if isHelpFlag(name) {
		writeHelp(stdout)
		return nil
	}
	c, ok := lookup(name)
	if !ok {
		return usageErrorf("legato rl: unknown subcommand %q; the subcommands are %s", name, names())
	}
	if err := c.run(ctx, args[1:], stdout, stderr); err != nil {
		return fmt.Errorf("legato rl %s: %w", name, err)
	}
	return nil
}

func names() string {
	var ns []string
	for _, c := range commands() {
		ns = append(ns, c.name)
	}
	return strings.Join(ns, ", ")
}

// runHelp is `legato rl help [subcommand]`. The help of a subcommand is
// what its -h prints, flags included, written to stdout: the subcommand
// parses "-h" and stops there, so nothing runs.
func runHelp(ctx context.Context, args []string, stdout, _ io.Writer) error {
	switch len(args) {
	case 0:
		writeHelp(stdout)
		return nil
	case 1:
		if args[0] == "help" || isHelpFlag(args[0]) {
			fmt.Fprint(stdout, "Usage: legato rl help [SUBCOMMAND]\n\nLists the subcommands, or shows one subcommand's usage and flags.\n")
			return nil
		}
		c, ok := lookup(args[0])
		if !ok {
			return usageErrorf("unknown subcommand %q; the subcommands are %s", args[0], names())
		}
		err := c.run(ctx, []string{"-h"}, stdout, stdout)
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		if err == nil {
			err = errors.New("printed no usage for -h")
		}
		return fmt.Errorf("help %s: %w", c.name, err)
	}
	return usageErrorf("want at most one subcommand, got %q", args)
}

func isHelpFlag(arg string) bool {
	switch arg {
	case "-h", "-help", "--help":
		return true
	}
	return false
}

// writeHelp writes the overview: what legato is and its subcommands.
func writeHelp(w io.Writer) {
	fmt.Fprint(w, `legato collects graded rollouts for reinforcement learning of computer-use
agents. It drives a pool of desktops (OSWorld tasks in VMs) against a model
served over an OpenAI-compatible API, grades every attempt with the task's own
evaluator, and writes trajectories a trainer can use as they are: token ids,
logprobs, rewards, group advantages and the policy version.

Usage:

  legato rl <subcommand> [flags]

Subcommands:

`)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	for _, c := range commands() {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	tw.Flush()
	fmt.Fprint(w, `
The model server's API key is read from LEGATO_POLICY_KEY, never from a flag.
Run 'legato rl help <subcommand>' for its usage and flags.
`)
}
