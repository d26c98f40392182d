"""What kvgate checks and how: state machines, invariants, targets and the gate CLI."""
