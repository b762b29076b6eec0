#!/usr/bin/env python3
"""The hybrid device tasks' generate run (scripts/device/hybrid_round.sh,
scripts/device/hybrid_decode_profile.sh), written once: PROMPTS random
prompts of 24 token ids (seed 0) as WORK/p.jsonl, and WORK/c.json, a config
whose target is the hf_hybrid folder FIXTURE on the GPU in bf16.

  hybrid_generate_setup.py WORK PROMPTS FIXTURE
"""
import json
import pathlib
import random
import sys

work, prompts, fixture = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
work.mkdir(parents=True, exist_ok=True)
random.seed(0)
with open(work / "p.jsonl", "w") as f:
    for _ in range(prompts):
        f.write(json.dumps({"input_ids": [random.randrange(260) for _ in range(24)]}) + "\n")
config = {
    "train": {"device": "cuda", "dtype": "bfloat16", "output_dir": str(work / "run")},
    "data": {"plugin": "jsonl", "path": str(work / "p.jsonl"), "row_length": 160, "tokens_per_batch": 640},
    "target": {"plugin": "hf_hybrid", "path": fixture},
    "drafter": {"plugin": "dflash", "num_layers": 1, "block_size": 8, "mask_token_id": 262},
    "loss": {"plugin": "fused_ckpt_kl"},
    "scheduler": {"plugin": "warmup_cosine"},
}
json.dump(config, open(work / "c.json", "w"))
