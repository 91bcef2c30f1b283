package hostagent

import (
	"context"
	"fmt"
	"log/slog"

	"legato/rl/desktop/osworld/vm"
)

// DefaultCommand is the agent's program on a host when the fleet is not
// told another: legato, found on the PATH of the SSH user's shell.
const DefaultCommand = "legato"

// Command is the argv that starts an agent: program (DefaultCommand when
// empty), with the fleet's fork directory and name prefix, so that the
// agent's templates are named and swept like the fleet's own.
func Command(program, forkDir, namePrefix string) []string {
	if program == "" {
		program = DefaultCommand
	}
	argv := []string{program, "rl", "host-agent"}
	if forkDir != "" {
		argv = append(argv, "--fork-dir", forkDir)
	}
	if namePrefix != "" {
		argv = append(argv, "--vm-prefix", namePrefix)
	}
	return argv
}

// Dial starts an agent on the remote host h over its SSH connection and
// says hello to it. An error says the host has no agent of this version
// there (or no SSH connection); its templates are then not forkable.
func Dial(ctx context.Context, h *vm.Host, argv []string, log *slog.Logger) (*Client, Hello, error) {
	cmd, err := h.StartCommand(ctx, argv)
	if err != nil {
		return nil, Hello{}, err
	}
	c := NewClient(h.Name(), cmd.Stdout(), cmd.Stdin(), cmd.Close, log)
	hello, err := c.Hello(ctx)
	if err != nil {
		c.Close(0)
		if tail := cmd.Stderr(); tail != "" {
			err = fmt.Errorf("%w (its stderr: %.300s)", err, tail)
		}
		return nil, Hello{}, fmt.Errorf("start the host agent (%s) on %s: %w", argv[0], h.Name(), err)
	}
	return c, hello, nil
}
