"""What every section of the tour shares: the header it prints."""


def section(title: str) -> None:
    print(f"\n=== {title} ===")
