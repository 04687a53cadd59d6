"""Evaluation of trained policies: the held-out direction probe, action statistics and learning-ladder records."""
