"""kvgate's system under test: the offloading manager, its policies, the copy worker and the
scheduler driver."""
