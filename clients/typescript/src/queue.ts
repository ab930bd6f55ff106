/** A single-consumer async queue: producers push, the consumer iterates. Internal. */
export class AsyncQueue<T> implements AsyncIterableIterator<T> {
  private readonly items: T[] = [];
  private head = 0;
  private waiter: { resolve: (r: IteratorResult<T>) => void; reject: (e: unknown) => void } | undefined;
  private done = false;
  private error: unknown = undefined;
  private failed = false;

  /** Called once when the consumer stops early (`break`, `return()`). */
  constructor(private readonly onReturn?: () => void) {}

  push(item: T): void {
    if (this.done) return;
    if (this.waiter !== undefined) {
      const w = this.waiter;
      this.waiter = undefined;
      w.resolve({ value: item, done: false });
    } else {
      this.items.push(item);
    }
  }

  end(): void {
    if (this.done) return;
    this.done = true;
    this.settleWaiter();
  }

  fail(error: unknown): void {
    if (this.done) return;
    this.done = true;
    this.failed = true;
    this.error = error;
    this.settleWaiter();
  }

  private settleWaiter(): void {
    if (this.waiter === undefined || this.head < this.items.length) return;
    const w = this.waiter;
    this.waiter = undefined;
    if (this.failed) {
      this.failed = false;
      w.reject(this.error);
    } else {
      w.resolve({ value: undefined, done: true });
    }
  }

  next(): Promise<IteratorResult<T>> {
    if (this.head < this.items.length) {
      const value = this.items[this.head]!;
      this.items[this.head++] = undefined as T;
      if (this.head > 1024 && this.head * 2 > this.items.length) {
        this.items.splice(0, this.head);
        this.head = 0;
      }
      return Promise.resolve({ value, done: false });
    }
    if (this.done) {
      if (this.failed) {
        this.failed = false;
        return Promise.reject(this.error);
      }
      return Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }

  return(): Promise<IteratorResult<T>> {
    if (!this.done) {
      this.done = true;
      this.onReturn?.();
    }
    this.items.length = 0;
    this.head = 0;
    this.failed = false;
    return Promise.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<T> {
    return this;
  }
}
