"""Where the model looks: the attention from its answer to the image tokens, and the picture evaluate
draws of it (the image, then base and trained attention laid over it on one colour scale, with panel
titles and a colour bar), one per evaluated image in `reports/eval/attention/`."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageDraw

from vgrpo.generation import append_tokens, batch_inputs

TITLE_HEIGHT = 16  # px above each panel for its title
BAR_WIDTH = 56  # px on the right: the colour bar and its scale


@torch.no_grad()
def image_attention(model, processor, row, completion_ids: list[int]) -> tuple[float, np.ndarray]:
    """Attention from the answer (completion) tokens to the image tokens, averaged over layers, heads
    and answer tokens: the share it puts on the image, and its distribution over the image grid."""
    inputs = batch_inputs(processor, [row], model.device)
    prompt_length = inputs["input_ids"].shape[1]
    completion = torch.tensor([completion_ids or [processor.tokenizer.eos_token_id]], device=model.device)
    inputs = append_tokens(inputs, completion)
    input_ids = inputs["input_ids"]
    output = model(**inputs, output_attentions=True)
    # layers x heads x answer tokens x keys -> mean over layers, heads and answer tokens
    weights = torch.stack([a[0, :, prompt_length - 1:-1] for a in output.attentions]).float().mean(dim=(0, 1, 2))
    image_positions = (input_ids[0] == model.config.image_token_id).nonzero().flatten()
    on_image = weights[image_positions]
    _, height, width = inputs["image_grid_thw"][0].tolist()
    merge = processor.image_processor.merge_size
    grid = on_image.reshape(height // merge, width // merge).cpu().numpy()
    return float(on_image.sum()), grid


def heatmap(image: Image.Image, grid: np.ndarray, low: float, high: float) -> Image.Image:
    """The image with the attention grid laid over it in red, brighter = more attention, on the colour
    scale [low, high]: base and trained get the same scale, so their panels compare."""
    spread = high - low
    scaled = np.clip((grid - low) / spread, 0, 1) if spread > 0 else np.zeros_like(grid)
    overlay = Image.fromarray((scaled * 255).astype(np.uint8)).resize(image.size, Image.Resampling.NEAREST)
    red = Image.new("RGB", image.size, (255, 0, 0))
    return Image.composite(red, image.convert("RGB"), overlay.point(lambda v: int(v * 0.6)))


def with_eager_attention(model):
    """Attention weights are only returned by the eager implementation."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation("eager")
    return model


def attention_sheet(image: Image.Image, grids: dict[str, np.ndarray], low: float, high: float,
                    question: str = "") -> Image.Image:
    """image | one heatmap per model (`grids`: name -> attention grid), each titled, the shared colour scale
    [low, high] as a bar on the right (share of the answer's attention per image token), the question below."""
    panels = [("image", image.convert("RGB"))] + [(f"{name} attention", heatmap(image, grid, low, high))
                                                  for name, grid in grids.items()]
    width, height = image.size
    sheet = Image.new("RGB", (width * len(panels) + BAR_WIDTH, height + 2 * TITLE_HEIGHT), "white")
    draw = ImageDraw.Draw(sheet)
    for i, (title, panel) in enumerate(panels):
        sheet.paste(panel, (i * width, TITLE_HEIGHT))
        draw.text((i * width + 4, 2), title, fill="black")
    top, bottom, left = TITLE_HEIGHT, TITLE_HEIGHT + height - 1, width * len(panels) + 6
    for y in range(top, bottom + 1):  # high at the top, as the heatmaps' brightest red
        level = (bottom - y) / max(1, bottom - top)
        draw.line([(left, y), (left + 12, y)], fill=(255, int(255 * (1 - 0.6 * level)), int(255 * (1 - 0.6 * level))))
    draw.rectangle([left, top, left + 12, bottom], outline="black")
    draw.text((left + 15, top), f"{high:.3f}", fill="black")
    draw.text((left + 15, bottom - 10), f"{low:.3f}", fill="black")
    draw.text((4, height + TITLE_HEIGHT + 2), question, fill="black")
    return sheet
