"""Replays, simulations, cost curves and the A/B harness: what tells whether drafting paid."""
