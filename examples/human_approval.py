"""Human in the loop: a job that stops to ask, and continues days later from another process.

    python examples/human_approval.py                      # drafts, then pauses for approval
    python examples/human_approval.py --answer yes         # continues with your answer

Nothing runs while the run is paused: answering without --answer just shows the question
again. The draft (a journaled step) is not recomputed when the run continues.
"""

from __future__ import annotations

import argparse

import afk_local as afk


def draft_email(customer: str) -> str:
    return f"Dear {customer}, your refund of 42 EUR is on its way."


def send_email(text: str, *, idempotency_key: str) -> str:
    return f"sent ({idempotency_key[:12]}...): {text}"


@afk.durable
def refund(ctx: afk.RunContext, customer: str) -> dict:
    draft = ctx.step("draft", draft_email, customer)
    answer = ctx.pause({"question": "Send this email?", "draft": draft})
    if answer != "yes":
        return {"sent": False, "answer": answer}
    receipt = ctx.step("send", send_email, draft)
    return {"sent": True, "receipt": receipt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-id", default="refund-demo")
    parser.add_argument("--customer", default="Ada")
    parser.add_argument("--answer", help="your answer to the paused question")
    args = parser.parse_args()
    try:
        if args.answer is None:
            result = refund.run(args.customer, run_id=args.run_id)
        else:
            # The job is defined in this script, so it resumes here (afk.resume finds it).
            result = afk.resume(args.run_id, input=args.answer)
    except afk.RunPaused as paused:
        print(f"run {args.run_id} is waiting: {paused.prompt}")
        print(f"answer with: python {__file__} --run-id {args.run_id} --answer yes")
        return
    print(f"run {args.run_id}: {result}")


if __name__ == "__main__":
    main()
