"""The lookup-stats replay, the cost simulation, cost curves and the A/B harness: what tells whether
drafting paid."""
