"""Commands that make and measure what a server reads, run beside a server, never inside one: a judge
head's mining, training and evaluation (`judge_head`), the replay of draft-length policies
(`replay`) and the cost profile (`profile_cost`), with the SGLang clients they share (`backends`)
and the user's prompts and grader (`prompts`). Nothing a server imports imports this package.
"""
