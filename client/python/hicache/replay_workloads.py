"""hicache-replay's workloads (hicache.replay): a Mooncake trace
(read_trace, mooncake_requests) or generated multi-turn conversations
(conversation_requests), as Request objects."""

import json
import random

import hicache


def read_trace(path, limit=None):
    requests = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                requests.append((int(record["timestamp"]), list(record["hash_ids"])))
            except (ValueError, KeyError) as e:
                raise SystemExit(f"{path}:{number}: not a Mooncake trace record ({e})")
            if limit is not None and len(requests) >= limit:
                break
    return requests


class Request:
    """One request: packed input tokens and its output reserve. `units` is
    the input length in hit-rate units (blocks or tokens), `unit` the tokens
    per unit."""
    __slots__ = ("timestamp_ms", "tokens", "reserve", "units", "unit")

    def __init__(self, timestamp_ms, tokens, reserve, units, unit):
        self.timestamp_ms = timestamp_ms
        self.tokens = tokens
        self.reserve = reserve
        self.units = units
        self.unit = unit


def mooncake_requests(trace, block_tokens):
    """Requests of a Mooncake trace: hash id h is tokens h * B .. h * B + B - 1."""
    blocks = {}

    def block(h):
        packed = blocks.get(h)
        if packed is None:
            packed = blocks[h] = hicache.pack_tokens(range(h * block_tokens,
                                                           (h + 1) * block_tokens))
        return packed

    for timestamp, hash_ids in trace:
        packed = b"".join(block(h) for h in hash_ids)
        yield Request(timestamp, packed, 0, len(hash_ids), block_tokens)


def conversation_requests(count, conversations, turns, system_tokens, user_tokens,
                          output_tokens, zipf, rate, seed):
    """Multi-turn conversations: every turn's input is its conversation's
    previous input and output plus a new user message of about `user_tokens`
    (half to 1.5 times); it generates about `output_tokens`. All start with
    one shared system prompt. Conversation i is picked with weight
    1 / (i + 1) ** zipf. Token ids are unique per message, so only what the
    workload shares is shared."""
    rng = random.Random(seed)
    next_id = [system_tokens + 1]

    def fresh(n):
        start = next_id[0]
        next_id[0] += n
        return hicache.pack_tokens(range(start, start + n))

    def about(mean):
        return max(1, rng.randint(mean // 2, mean + mean // 2)) if mean > 0 else 0

    system = hicache.pack_tokens(range(1, system_tokens + 1))
    history = [system] * conversations  # Packed input + output so far.
    turn = [0] * conversations
    weights = [1.0 / (i + 1) ** zipf for i in range(conversations)]
    cumulative, total = [], 0.0
    for w in weights:
        total += w
        cumulative.append(total)
    pick = range(conversations)
    for i in range(count):
        c = rng.choices(pick, cum_weights=cumulative)[0]
        if turn[c] >= turns:
            history[c], turn[c] = system, 0
        tokens = history[c] + fresh(about(user_tokens))
        output = about(output_tokens)
        history[c] = tokens + fresh(output)
        turn[c] += 1
        yield Request(int(i * 1000.0 / rate), tokens, output, len(tokens) // 4, 1)
