"""A small real model: linear regression trained by gradient descent with numpy.

Reads CSV files from the `train` channel when there is one, otherwise
generates its own data. Saves the weights to the model dir and a metrics file
to the output data dir.
"""
import argparse
import glob
import json
import os

import numpy as np


def load_or_generate(channel_dir, n_features, seed):
    files = sorted(glob.glob(os.path.join(channel_dir, "*.csv"))) if channel_dir else []
    if files:
        data = np.concatenate([np.loadtxt(f, delimiter=",", ndmin=2) for f in files])
        return data[:, :-1], data[:, -1], None
    rng = np.random.default_rng(seed)
    true_w = rng.normal(size=n_features)
    x = rng.normal(size=(2000, n_features))
    y = x @ true_w + 0.5 + rng.normal(scale=0.05, size=len(x))
    return x, y, true_w


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--features", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    x, y, true_w = load_or_generate(os.environ.get("SM_CHANNEL_TRAIN"), args.features, args.seed)
    w, b = np.zeros(x.shape[1]), 0.0
    for epoch in range(args.epochs):
        err = x @ w + b - y
        w -= args.lr * (x.T @ err) / len(y)
        b -= args.lr * err.mean()
        if epoch % 50 == 0 or epoch == args.epochs - 1:
            print("epoch %d mse %.6f" % (epoch, float((err ** 2).mean())))
    mse = float(((x @ w + b - y) ** 2).mean())

    model_dir = os.environ.get("SM_MODEL_DIR", "model")
    os.makedirs(model_dir, exist_ok=True)
    np.savez(os.path.join(model_dir, "model.npz"), weights=w, bias=b)
    metrics = {"mse": mse, "host": os.environ.get("SM_CURRENT_HOST")}
    if true_w is not None:
        metrics["weight_error"] = float(np.abs(w - true_w).max())
    out_dir = os.environ.get("SM_OUTPUT_DATA_DIR", "output")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f)
    print("final mse %.6f; model saved to %s" % (mse, model_dir))


if __name__ == "__main__":
    main()
