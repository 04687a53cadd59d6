"""r1trade's trading environment inside other training libraries (`trl`: TRL's GRPOTrainer)."""
