#!/usr/bin/env python3
"""Gradient size lists of three models, in backward order, derived from their architectures.

A framework hands its allreduce backend one gradient per parameter tensor, last layer first, as
backward produces them. This script writes those lists (data/fusion/<model>.csv) from the
architectures themselves, so that nothing is copied from a framework:

  resnet50     torchvision's ResNet-50 (v1.5: the stride on the 3x3 conv of each bottleneck),
               ImageNet head; 161 tensors, 25,557,032 parameters.
  bert-base    Hugging Face's BertModel, bert-base-uncased (12 layers, width 768, 12 heads,
               FFN 3072, vocabulary 30522, 512 positions, 2 token types, with the pooler);
               199 tensors, 109,482,240 parameters.
  llm24x2048   a stack of 24 pre-norm GPT-style transformer layers of width 2048 (fused QKV
               projection, FFN 4x, biases, two LayerNorms); no embeddings, no head;
               288 tensors, 1,208,598,528 parameters.

Each line: name,count,dtype,flops. `flops` is an estimate of the floating-point operations
that backward spends on the layer that owns the tensor, for ONE sample (ResNet-50: one 224x224
image; BERT: a sequence of 128 tokens; the transformer stack: 2048 tokens), taken as twice the
forward cost (gradients of inputs and of weights): a convolution or linear layer costs
2*MACs forward, so 4*MACs backward; a normalisation about 8 operations per activation element
backward; attention's score and value products (no parameters of their own) are charged to the
layer's QKV weight; a layer's whole cost is charged to its weight tensor, its bias (and a norm's
bias) carry 0. loom-fusion-bench multiplies by the batch size and divides by a stated FLOP rate
to get the busy time between tensors.

Usage:
  scripts/model_grads.py [--out DIR]     write the three files (default data/fusion)
  scripts/model_grads.py --check [DIR]   regenerate in memory, compare with DIR's files byte for
                                         byte and the totals with the published counts; exit 1
                                         on any difference
"""
import os
import sys

DTYPE = "float32"

# Published parameter counts (torchvision's model card for resnet50; Hugging Face's
# bert-base-uncased BertModel), and the tensor counts of the same implementations.
PUBLISHED = {
    "resnet50": (161, 25557032),
    "bert-base": (199, 109482240),
    "llm24x2048": (288, 24 * (12 * 2048 * 2048 + 13 * 2048)),
}


def resnet50():
    """Forward order: (name, count, flops) per parameter tensor."""
    out = []

    def conv(name, cin, cout, k, hout):
        macs = cin * cout * k * k * hout * hout
        out.append((name + ".weight", cin * cout * k * k, 4 * macs))
        return hout

    def bn(name, c, hw):
        out.append((name + ".weight", c, 8 * c * hw * hw))
        out.append((name + ".bias", c, 0))

    conv("conv1", 3, 64, 7, 112)
    bn("bn1", 64, 112)
    hw = 56  # after the max pool
    cin = 64
    for li, (blocks, width, stride) in enumerate([(3, 64, 1), (4, 128, 2), (6, 256, 2),
                                                  (3, 512, 2)]):
        for b in range(blocks):
            p = "layer%d.%d" % (li + 1, b)
            s = stride if b == 0 else 1
            hout = hw // s
            conv(p + ".conv1", cin, width, 1, hw)
            bn(p + ".bn1", width, hw)
            conv(p + ".conv2", width, width, 3, hout)
            bn(p + ".bn2", width, hout)
            conv(p + ".conv3", width, width * 4, 1, hout)
            bn(p + ".bn3", width * 4, hout)
            if b == 0:
                conv(p + ".downsample.0", cin, width * 4, 1, hout)
                bn(p + ".downsample.1", width * 4, hout)
            cin = width * 4
            hw = hout
    out.append(("fc.weight", 2048 * 1000, 4 * 2048 * 1000))
    out.append(("fc.bias", 1000, 0))
    return out


def linear(out, name, fin, fout, tokens, extra=0):
    out.append((name + ".weight", fin * fout, 4 * fin * fout * tokens + extra))
    out.append((name + ".bias", fout, 0))


def layernorm(out, name, d, tokens):
    out.append((name + ".weight", d, 8 * d * tokens))
    out.append((name + ".bias", d, 0))


def bert_base():
    d, ffn, layers, seq, vocab = 768, 3072, 12, 128, 30522
    out = []
    # embedding gradients are scatter-adds of the tokens' rows: d operations per token
    out.append(("embeddings.word_embeddings.weight", vocab * d, d * seq))
    out.append(("embeddings.position_embeddings.weight", 512 * d, d * seq))
    out.append(("embeddings.token_type_embeddings.weight", 2 * d, d * seq))
    layernorm(out, "embeddings.LayerNorm", d, seq)
    for i in range(layers):
        p = "encoder.layer.%d." % i
        # QK^T and AV: 2 * seq^2 * d MACs forward, 4x that in FLOPs backward
        attn = 4 * 2 * seq * seq * d
        linear(out, p + "attention.self.query", d, d, seq, attn)
        linear(out, p + "attention.self.key", d, d, seq)
        linear(out, p + "attention.self.value", d, d, seq)
        linear(out, p + "attention.output.dense", d, d, seq)
        layernorm(out, p + "attention.output.LayerNorm", d, seq)
        linear(out, p + "intermediate.dense", d, ffn, seq)
        linear(out, p + "output.dense", ffn, d, seq)
        layernorm(out, p + "output.LayerNorm", d, seq)
    linear(out, "pooler.dense", d, d, 1)
    return out


def llm_stack():
    d, layers, seq = 2048, 24, 2048
    out = []
    for i in range(layers):
        p = "layers.%d." % i
        layernorm(out, p + "ln_1", d, seq)
        linear(out, p + "attn.qkv", d, 3 * d, seq, 4 * 2 * seq * seq * d)
        linear(out, p + "attn.proj", d, d, seq)
        layernorm(out, p + "ln_2", d, seq)
        linear(out, p + "mlp.fc1", d, 4 * d, seq)
        linear(out, p + "mlp.fc2", 4 * d, d, seq)
    return out


MODELS = {
    "resnet50": (resnet50, "one 224x224 image"),
    "bert-base": (bert_base, "one sequence of 128 tokens"),
    "llm24x2048": (llm_stack, "2048 tokens"),
}


def render(model):
    fn, sample = MODELS[model]
    fwd = fn()
    rows = list(reversed(fwd))  # backward order: last layer's gradients first
    total = sum(c for _, c, _ in rows)
    flops = sum(f for _, _, f in rows)
    lines = [
        "# %s: gradient tensors in backward order (generated by scripts/model_grads.py)" % model,
        "# tensors=%d params=%d backward_flops_per_sample=%d (sample: %s)" %
        (len(rows), total, flops, sample),
        "name,count,dtype,flops",
    ]
    lines += ["%s,%d,%s,%d" % (n, c, DTYPE, f) for n, c, f in rows]
    return "\n".join(lines) + "\n", len(rows), total


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "data", "fusion")
    if argv[:1] == ["--check"]:
        d = argv[1] if len(argv) > 1 else default
        bad = 0
        for m in MODELS:
            text, n, total = render(m)
            want = PUBLISHED[m]
            if (n, total) != want:
                print("%s: %d tensors, %d parameters; published: %d, %d" % (m, n, total, *want))
                bad += 1
            path = os.path.join(d, m + ".csv")
            try:
                with open(path) as f:
                    shipped = f.read()
            except OSError as e:
                print("%s: %s" % (path, e))
                bad += 1
                continue
            if shipped != text:
                a, b = shipped.splitlines(), text.splitlines()
                line = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]),
                            min(len(a), len(b)))
                print("%s: differs from the regenerated list at line %d" % (path, line + 1))
                bad += 1
            else:
                print("%s: %d tensors, %d parameters, as published" % (path, n, total))
        return 1 if bad else 0
    d = default
    if argv[:1] == ["--out"] and len(argv) > 1:
        d = argv[1]
    elif argv:
        print(__doc__)
        return 2
    os.makedirs(d, exist_ok=True)
    for m in MODELS:
        text, n, total = render(m)
        with open(os.path.join(d, m + ".csv"), "w") as f:
            f.write(text)
        print("%s: %d tensors, %d parameters" % (m, n, total))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
