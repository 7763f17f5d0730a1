"""The trainer's loss covers every answer of a chat, and multi-turn rows put each picture and clip at its
own placeholders (run c trained only a chat's last answer: the answer naming the picture went unlearned)."""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "training"))
sys.path.insert(0, str(ROOT / "scripts"))
import build_data  # noqa: E402
from train import AUDIO, IMAGE, Chats, answer_mask  # noqa: E402

from backend.tokenizer import ChatTokenizer  # noqa: E402

TOKENIZER = ChatTokenizer.from_model_dir(ROOT / "assets" / "inkling-tiny")


def chat(messages, counts):
    return torch.tensor(build_data.chat_ids(TOKENIZER, messages, counts))


def answers_under(mask: torch.Tensor, ids: torch.Tensor) -> list[str]:
    """The text under each run of True in the mask."""
    runs, current = [], []
    for keep, token in zip(mask.tolist() + [False], ids.tolist() + [0]):
        if keep:
            current.append(token)
        elif current:
            runs.append(TOKENIZER.decode(current))
            current = []
    return runs


def test_the_loss_covers_every_answer_and_nothing_the_user_wrote():
    ids = chat([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What shape is this?"}]},
                {"role": "model", "content": "A red star."},
                {"role": "user", "content": "Is this a circle?"},
                {"role": "model", "content": "No, it is a red star."}], [3])
    assert answers_under(answer_mask(ids), ids) == ["A red star.", "No, it is a red star."]


def test_history_rows_keep_each_picture_and_clip_at_its_placeholders():
    image_chat = chat([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
                       {"role": "model", "content": "A blue square."}], [2])
    audio_chat = chat([{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What does the speaker say?"}]},
                       {"role": "model", "content": "Hello."}], [3])
    text_chat = chat([{"role": "user", "content": "Hi"}, {"role": "model", "content": "Hello!"}], [])
    patches = [torch.full((2, 8, 8, 3), float(i)) for i in (1, 2)]        # image i: every pixel = i
    frames = [torch.full((3, 80), 5, dtype=torch.long)]

    class Tower:   # stands in for the model: image rows carry their image's number, audio rows -1
        def encode_images(self, x):
            return x.flatten(1).mean(1, keepdim=True).expand(-1, 4)
        def encode_audio(self, bins):
            return torch.full((bins.shape[0], 4), -1.0)

    chats = Chats({"image": ([image_chat, image_chat], patches, "image"), "audio": ([audio_chat], frames, "audio"),
                   "text": ([text_chat], [None], "text")}, seed=0)
    rows = [[("text", 0), ("image", 1), ("audio", 0), ("image", 0)], [("image", 0)]]
    ids, media, index, mask, lengths = chats.batch(Tower(), rows, "cpu")
    flat = ids.flatten()
    assert len(index) == len(media) == 2 + 3 + 2 + 2
    placed = {int(i): float(v) for i, v in zip(index, media[:, 0])}
    assert [flat[i].item() for i in sorted(placed)][:7] == [IMAGE, IMAGE, AUDIO, AUDIO, AUDIO, IMAGE, IMAGE]
    assert [placed[i] for i in sorted(placed) if i < ids.shape[1]] == [2.0, 2.0, -1.0, -1.0, -1.0, 1.0, 1.0]
    assert answers_under(mask[0], ids[0]) == ["Hello!", "A blue square.", "Hello.", "A blue square."]
    assert lengths.tolist() == [len(text_chat) + len(image_chat) + len(audio_chat) + len(image_chat), len(image_chat)]
