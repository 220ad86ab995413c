"""A tiny stand-in for a model library: the file the patch-and-rerun session fixes.

Like a transformers model, forward() can return the hidden states of every layer; this copy
has two bugs the session patches away, one at a time, as they show up.
"""

NUM_LAYERS = 4


def embed(tokens):
    return [float(len(t)) for t in tokens]


def layer(i, hidden):
    return [round(h * 0.5 + i, 4) for h in hidden]


def forward(tokens, output_hidden_states=False):
    hidden = embed(tokens)
    states = []
    for i in range(NUM_LAYERS):
        hidden = layer(i, hidden)
        states.append(hidden)
    out = {"logits": hidden}
    return out
