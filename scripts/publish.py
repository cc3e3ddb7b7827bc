"""Publish a finished run to the Hugging Face Hub (vgrpo/publish.py): the GGUF files and their card to
`<user>/<name>-GGUF`, the merged model to `<user>/<name>`, the LoRA adapter to `<user>/<name>-LoRA`, each
card tied to what the model came from. Run it in the repo where the pipeline ran, after smoke passed:

    HF_TOKEN=hf_... python scripts/publish.py --user <your-hub-name>
    python scripts/publish.py --user <your-hub-name> --name shapes-counter --private   # after `hf auth login`

The token comes from HF_TOKEN or the Hub's login; it is never written to a file or printed. Then, on any
machine with llama.cpp: `llama-server -hf <user>/<name>-GGUF:Q4_K_M --no-repack`.
"""

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vgrpo.cli import user_errors  # noqa: E402


@click.command()
@click.option("--user", required=True, help="The Hub user or organization the repos go to.")
@click.option("--name", default=None,
              help="The repos' name [default: the GGUF stem, e.g. Qwen3-VL-8B-Instruct-shapes-grpo].")
@click.option("--private", is_flag=True, help="Create the repos private.")
@click.option("--run", "run_dir", default=".", show_default=True, type=click.Path(exists=True, file_okay=False),
              help="The repo where the pipeline ran.")
def main(user: str, name: str | None, private: bool, run_dir: str) -> None:
    """Upload the run's GGUF files, merged model and adapter, with their cards."""
    with user_errors():
        from vgrpo.publish import publish

        repos = publish(Path(run_dir), user, name, private, log=click.echo)
        click.echo(f"publish: done; llama.cpp: llama-server -hf {repos['gguf']}:Q4_K_M --no-repack")


if __name__ == "__main__":
    main()
