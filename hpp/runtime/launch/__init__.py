"""Starting ranks: torchrun (one or several hosts) or fork, the rank's entry point that resolves its binding
(plan rank, device, local GPU), and the process hygiene around them (no orphan, no stale scratch dir).
"""
