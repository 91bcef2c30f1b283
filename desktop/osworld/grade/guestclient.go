package grade

import (
	"context"
	"errors"
	"fmt"

	"legato/rl/desktop/osworld/guest"
)

// GuestClient adapts a guest server client to Guest: an error status the
// guest answered with (a 404 for a missing file, a 500 for a command it
// could not start) becomes ErrRefused, as OSWorld's getters turn it into
// None; a guest that did not answer stays an error.
func GuestClient(c *guest.Client) Guest { return clientGuest{c} }

type clientGuest struct{ c *guest.Client }

func (g clientGuest) File(ctx context.Context, path string) ([]byte, error) {
	data, err := g.c.File(ctx, path)
	return data, answered(err)
}

func (g clientGuest) Execute(ctx context.Context, argv []string, shell bool) (ExecResult, error) {
	res, err := g.c.Execute(ctx, guest.Command{Args: argv, Shell: shell})
	if err != nil {
		return ExecResult{}, answered(err)
	}
	return ExecResult{Output: res.Output, Error: res.Error, ReturnCode: res.ReturnCode}, nil
}

func (g clientGuest) Accessibility(ctx context.Context) (string, error) {
	tree, err := g.c.Accessibility(ctx)
	return tree, answered(err)
}

// answered marks the errors that are the guest's answer.
func answered(err error) error {
	var ge *guest.Error
	if errors.As(err, &ge) && ge.Status != 0 && !errors.Is(err, guest.ErrBadResponse) {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return err
}
